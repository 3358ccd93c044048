"""Stopping a real ``omlx serve`` with SIGINT or SIGTERM while it serves (issue 38, item 6).

The server runs as ``make serve`` runs it: the ``omlx`` console script under a parent shell,
in a process group of their own, Ctrl-C reaching the whole group. Streams running when the
signal comes end within a second with their error event and terminator; a request already
received gets a 503; new connections are refused (the port closes at once); what the
generations computed is kept; the log has no traceback; ``omlx`` exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.scripted_model import build_scripted_model
from tests.server_process import ServerProcess, free_port
from tests.storage_checks import assert_cache_invariants
from tests.tiny_model import build_tiny_model

STOPPING = "the server is stopping; retry once it has restarted"
LONG = 30000  # max tokens: the looping model decodes until the stop
SHELL_SAYS = "omlx exit status:"
BROKEN = ("Traceback", "terminate called", "Aborted", "Segmentation fault", "Fatal Python error")


@pytest.fixture(scope="module")
def looping_model(tmp_path_factory) -> Path:
    """The scripted model whose chat turns decode ``<|loop|>`` until max_tokens."""
    out = build_scripted_model(tmp_path_factory.mktemp("looping") / "scripted")
    config_file = out / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    cue = "{% else %}<|chat|>{% endif %}"
    assert cue in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(cue, "{% else %}<|loop|>{% endif %}")
    config_file.write_text(json.dumps(config))
    return out


class ShellServer:
    """``omlx serve`` under ``bash -c`` in a new session, as make runs a recipe."""

    def __init__(self, work: Path, *args: str) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.cache_dir = work / "cache"
        self.log_path = work / "serve.log"
        omlx = Path(sys.executable).parent / "omlx"  # the console script
        command = [str(omlx), "serve", "--port", str(self.port), *args]
        command += ["--paged-ssd-cache-dir", str(self.cache_dir)]
        script = f'{" ".join(command)}; echo "{SHELL_SAYS} $?"'
        with open(self.log_path, "wb") as log:
            self.shell = subprocess.Popen(
                ["bash", "-c", script], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_health(self, ready: Callable[[dict], bool], timeout: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.shell.poll() is None, self.log()
            try:
                health = httpx.get(self.base_url + "/health", timeout=1.0).json()
                if ready(health):
                    return health
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)
        raise TimeoutError(self.log())

    def interrupt(self) -> float:
        """SIGINT to the whole group, as Ctrl-C in a terminal sends it; the time it was sent."""
        sent = time.monotonic()
        os.killpg(self.shell.pid, signal.SIGINT)
        return sent

    def exit_status(self, timeout: float = 120.0) -> int:
        """omlx's exit status, as the parent shell saw it."""
        assert self.shell.wait(timeout) == 0, self.log()
        said = [line for line in self.log().splitlines() if line.startswith(SHELL_SAYS)]
        assert said, self.log()
        return int(said[-1].removeprefix(SHELL_SAYS))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.shell.poll() is None:
            os.killpg(self.shell.pid, signal.SIGKILL)
            self.shell.wait()


def assert_clean(log: str) -> None:
    for sign in BROKEN:
        assert sign not in log, f"{sign!r} in the log:\n{log[-4000:]}"


def kv_rows(cache_dir: Path) -> int:
    with sqlite3.connect(cache_dir / "index.db") as db:
        return db.execute("SELECT COUNT(*) FROM blocks WHERE kind = 'kv'").fetchone()[0]


class Client(threading.Thread):
    """One client's stream: how many pieces it saw, how it ended, and when."""

    def __init__(self, run: Callable[[Client], None]) -> None:
        super().__init__(daemon=True)
        self.run_stream = run
        self.pieces = 0
        self.streaming = threading.Event()  # it has seen generated text
        self.ended_at: float | None = None
        self.lines: list[str] = []
        self.error: Exception | None = None

    def saw(self, pieces: int = 1) -> None:
        self.pieces += pieces
        if self.pieces >= 64:  # four blocks of 16 decoded: worth keeping
            self.streaming.set()

    def run(self) -> None:
        try:
            self.run_stream(self)
        except Exception as exc:
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.streaming.set()


def chat_body(n: int) -> dict:
    content = f"conversation {n}: write until told to stop"
    return {"model": "scripted", "messages": [{"role": "user", "content": content}]}


def openai_raw(base_url: str) -> Callable[[Client], None]:
    """The official client's raw SSE lines: the terminator itself is checked."""

    def run(c: Client) -> None:
        api = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
        create = api.chat.completions.with_streaming_response.create
        with create(**chat_body(1), max_tokens=LONG, stream=True) as response:
            for line in response.iter_lines():
                if line:
                    c.lines.append(line)
                    c.saw()

    return run


def openai_parsed(base_url: str) -> Callable[[Client], None]:
    def run(c: Client) -> None:
        api = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
        for chunk in api.chat.completions.create(**chat_body(2), max_tokens=LONG, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                c.saw()

    return run


def anthropic_stream(base_url: str) -> Callable[[Client], None]:
    def run(c: Client) -> None:
        api = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0)
        with api.messages.stream(**chat_body(3), max_tokens=LONG) as stream:
            for event in stream:
                c.lines.append(event.type)
                if event.type == "content_block_delta":
                    c.saw()

    return run


def responses_stream(base_url: str) -> Callable[[Client], None]:
    def run(c: Client) -> None:
        api = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
        body = {"model": "scripted", "input": "conversation 4: write until told to stop"}
        for event in api.responses.create(**body, max_output_tokens=LONG, stream=True):
            c.lines.append(json.dumps(event.model_dump(mode="json")))
            if event.type == "response.output_text.delta":
                c.saw()

    return run


def whole_answer(base_url: str) -> Callable[[Client], None]:
    """A request that is not streamed, still generating when the stop comes."""

    def run(c: Client) -> None:
        api = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
        c.streaming.set()
        api.chat.completions.create(**chat_body(5), max_tokens=LONG)

    return run


def test_ctrl_c_under_a_make_like_shell_ends_every_stream_cleanly(looping_model, tmp_path):
    server = ShellServer(tmp_path, "--model", str(looping_model), "--block-size", "16")
    try:
        server.wait_health(lambda h: h.get("ready", False))
        url = server.base_url
        clients = [
            Client(make(url))
            for make in (openai_raw, openai_parsed, anthropic_stream, responses_stream)
        ]
        whole = Client(whole_answer(url))
        for client in [*clients, whole]:
            client.start()
        for client in clients:
            assert client.streaming.wait(60) and client.ended_at is None, client.error
        server.wait_health(lambda h: h["engine"]["active"] == 5, timeout=30)
        sent = server.interrupt()
        for client in [*clients, whole]:
            client.join(10)
        # A connection opened now finds the port closed: nothing it sends can be lost.
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2.0)
        status = server.exit_status()
    finally:
        server.kill()
    log = server.log()
    assert status == 0, log
    assert_clean(log)
    for client in [*clients, whole]:
        assert client.ended_at is not None and client.ended_at - sent < 1.0, (
            client.ended_at - sent if client.ended_at else None,
            client.error,
        )
    raw, parsed, messages, responses = clients
    assert raw.lines[-1] == "data: [DONE]"
    assert json.loads(raw.lines[-2].removeprefix("data: "))["error"] == {
        "message": STOPPING,
        "type": "server_error",
        "param": None,
        "code": "server_stopping",
    }
    assert isinstance(parsed.error, openai.APIError) and STOPPING in str(parsed.error)
    assert isinstance(messages.error, anthropic.APIStatusError), messages.error
    assert messages.error.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": STOPPING},
    }
    error, failed = (json.loads(line) for line in responses.lines[-2:])
    assert (error["type"], error["code"], error["message"]) == (
        "error",
        "server_stopping",
        STOPPING,
    )
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert isinstance(whole.error, openai.APIStatusError), whole.error
    assert whole.error.status_code == 503 and whole.error.code == "server_stopping"
    # What each stream decoded is kept, as for a client that left: written before the exit.
    assert kv_rows(server.cache_dir) >= sum(c.pieces // 16 for c in clients)
    assert_cache_invariants(server.cache_dir)


@pytest.mark.slow
def test_sigterm_mid_prefill_keeps_the_prefill_for_the_retry_after_a_restart(tmp_path):
    """SIGTERM (a supervisor's stop) while a long prompt is prefilled: its stream ends at
    once with the error and ``[DONE]``, and the restarted server restores what had been
    computed."""
    model = build_tiny_model(tmp_path / "deep-tiny", layers=8)
    prompt = [(7 * i) % 290 + 3 for i in range(2000)]
    body = {"model": "deep-tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    args = ("--model", str(model), "--block-size", "16", "--prefill-step-size", "64")
    cache = tmp_path / "cache"
    server = ServerProcess(*args, cache_dir=cache, log_path=tmp_path / "first.log").start()
    lines: list[str] = []
    ended = threading.Event()

    def stream() -> None:
        with httpx.stream(
            "POST", server.base_url + "/v1/completions", json=body | {"stream": True}, timeout=60
        ) as r:
            lines.extend(line for line in r.iter_lines() if line)
        ended.set()

    try:
        threading.Thread(target=stream, daemon=True).start()
        deadline = time.monotonic() + 60
        while kv_rows(cache) < 8:
            assert time.monotonic() < deadline and not ended.is_set(), server.read_log()
            time.sleep(0.02)
        at_signal = kv_rows(cache)
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert ended.wait(1.0), "the stream did not end within a second"
        took = time.monotonic() - sent
        status = server.proc.wait(120)
    finally:
        server.kill()
    assert status == 0 and took < 1.0
    assert_clean(server.read_log())
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2].removeprefix("data: "))["error"]["code"] == "server_stopping"
    kept = kv_rows(cache)
    assert kept >= at_signal
    assert_cache_invariants(cache)
    with ServerProcess(*args, cache_dir=cache, log_path=tmp_path / "again.log") as again:
        retry = httpx.post(again.base_url + "/v1/completions", json=body, timeout=120).json()
    cached = retry["usage"]["prompt_tokens_details"]["cached_tokens"]
    # The rows are one chain, the prompt's, cut as its chunks completed (one may be partial).
    assert (kept - 1) * 16 <= cached < len(prompt) - 1, (kept, cached)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("phase", "says"),
    [("importing the HTTP app", "stopped while starting"), ("loading", "waiting for the load of")],
)
def test_ctrl_c_while_starting_or_loading_the_default_model_exits_0(tmp_path, phase, says):
    """Ctrl-C under ``make serve`` before the bundled model was ready aborted the process
    (``terminate called without an active exception``: its loading thread was still in
    MLX when the interpreter exited). The start stops, or the load ends first, then exit 0."""
    server = ShellServer(tmp_path)  # the bundled model: seconds to read and dequantize
    try:
        server.wait_health(lambda h: any(phase in step for step in h.get("waiting_for", [])))
        server.interrupt()
        status = server.exit_status()
    finally:
        server.kill()
    log = server.log()
    assert status == 0, log
    assert says in log, log
    assert_clean(log)

"""A newcomer's first minutes (issue 27): the README's quick-start snippet against a real
server, and each start-up mistake as one line, exit status 2 and no traceback."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server_process import ServerProcess, free_port

README = Path(__file__).resolve().parents[2] / "README.md"


def quick_start_snippet() -> str:
    """The README's first Python block: the one the quick start tells people to run."""
    return re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S).group(1)


@pytest.fixture(scope="module")
def aliased_default_server(tmp_path_factory) -> Iterator[ServerProcess]:
    """The default model on a fresh cache, with one alias added by flag."""
    work = tmp_path_factory.mktemp("first-contact")
    server = ServerProcess(
        "--model-alias",
        "gpt-4o=smollm2-135m-instruct",
        cache_dir=work / "cache",
        log_path=work / "server.log",
    )
    with server:
        yield server


def test_the_quick_start_snippet_prints_what_the_readme_says(aliased_default_server, tmp_path):
    snippet = quick_start_snippet()
    said = re.findall(r"\)\s+# (.+)", snippet)  # the comments after each print(...)
    assert said[0] == "The capital of France is Paris."
    first_time, again = re.match(r"(\d+) the first time, (\d+) when run again", said[1]).groups()
    script = tmp_path / "ask.py"
    script.write_text(snippet.replace("127.0.0.1:8000", f"127.0.0.1:{aliased_default_server.port}"))
    runs = [
        subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-2000:]
    assert [r.stdout.splitlines() for r in runs] == [[said[0], first_time], [said[0], again]]
    # The replay was restored from a partial block (37 tokens < one 64-token block): /health says so.
    restored = httpx.get(aliased_default_server.base_url + "/health").json()["cache"]["restored"]
    assert restored["partial_blocks"] >= 1 and restored["tokens"] >= int(again)


def test_an_alias_flag_keeps_the_default_claude_alias(aliased_default_server):
    models = httpx.get(aliased_default_server.base_url + "/v1/models").json()["data"]
    assert models[0]["aliases"] == ["gpt-4o", "claude-*"]
    for name in ("gpt-4o", "claude-sonnet-4-5"):
        body = {"model": name, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
        path = "/v1/messages" if name.startswith("claude") else "/v1/chat/completions"
        assert (
            httpx.post(aliased_default_server.base_url + path, json=body, timeout=60).status_code
            == 200
        )


def _serve_fails(*args: str, cwd: Path) -> str:
    """``omlx serve ARGS``: exit status 2, no traceback, one line that is not a log line."""
    done = subprocess.run(
        [sys.executable, "-m", "omlx", "serve", "--paged-ssd-cache-dir", str(cwd / "cache"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output and "serving" not in output, output
    said = [
        line for line in output.splitlines() if line and not re.match(r"\d{4}-\d\d-\d\d ", line)
    ]
    assert len(said) == 1 and said[0].startswith("omlx: "), output
    return said[0]


def test_a_port_in_use_is_said_before_anything_loads(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        said = _serve_fails("--port", str(port), cwd=tmp_path)
    assert said.startswith(f"omlx: port {port} on 127.0.0.1 is already in use") and "--port" in said
    assert not (tmp_path / "cache").exists()  # nothing was opened, let alone loaded


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("prot = 9000\n", "unknown setting 'prot' (did you mean 'port'?)"),
        ("[server]\nport = 9000\n", "not a [server] section"),
        ('block_size = "big"\n', 'block_size = "big": expected a whole number'),
        ("port 9000\n", "not valid TOML"),
    ],
    ids=["misspelt", "section", "type", "toml"],
)
def test_a_config_file_mistake_names_the_file(tmp_path, text, expected):
    config = tmp_path / "omlx.toml"
    config.write_text(text)
    said = _serve_fails("--config", str(config), "--port", str(free_port()), cwd=tmp_path)
    assert said.startswith(f"omlx: {config}: ") and expected in said and "$." not in said


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--model", "/no/such/model.gguf"), "not found"),
        (("--hot-cache-max-size", "lots"), "--hot-cache-max-size: hot_cache_max_size: bad size"),
        (("--model-alias", "x=nope"), "points at 'nope', which is not served"),
    ],
    ids=["model", "size", "alias"],
)
def test_a_flag_mistake_is_one_line(tmp_path, args, expected):
    said = _serve_fails(*args, "--port", str(free_port()), cwd=tmp_path)
    assert expected in said


def test_the_log_reads_as_one_format_with_sizes_and_models_named(aliased_default_server):
    body = {"model": "gpt-4o", "max_tokens": 2, "messages": [{"role": "user", "content": "Hello"}]}
    httpx.post(aliased_default_server.base_url + "/v1/chat/completions", json=body, timeout=60)
    lines = [line for line in aliased_default_server.read_log().splitlines() if line]
    stamped = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) \S+: ")
    assert all(stamped.match(line) for line in lines), [x for x in lines if not stamped.match(x)]
    log = "\n".join(lines)
    assert "INFO uvicorn: Started server process" in log and "INFO uvicorn.access: " in log
    assert "alembic" not in log and "created the cache index" in log  # one line, not sixteen
    assert re.search(r"memory guard of smollm2-135m-instruct: [\d.]+ [KMG]B of KV memory", log)
    assert "a request may use 8,192 (prompt + max_tokens, capped by the model's context)" in log
    assert "ReconcileReport(" not in log and "cache folder reconciled: nothing to remove" in log
    served = [
        line
        for line in lines
        if re.search(r"omlx\.adapters\.mlx\.batch\.engine: request \d+ ", line)
    ]
    assert served and all("(smollm2-135m-instruct)" in line for line in served)
    assert log.index("serving smollm2-135m-instruct on") < log.index(
        "uvicorn: Started server process"
    )

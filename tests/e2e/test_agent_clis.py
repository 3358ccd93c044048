"""The real agent CLIs (Claude Code, Codex from npm) driven against a real ``omlx serve``.

They are installed into ``.agents/`` by ``scripts/install-agents.sh`` (``make`` runs it where
npm is, and so does the ``agent_clis`` fixture); these tests skip only where node or npm is
missing. Each CLI runs in a fresh HOME so no user configuration reaches it, and talks to
the agent test model, whose prompts are as long as real agent prompts and whose answers
end after a few tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from omlx.app.launch.agent_settings import Endpoint, codex_setup
from tests.agent_model import CONTEXT, MODEL_ID, REPLY
from tests.e2e.agent_cli import ClaudeCode, failed_requests, finished_requests, prompt_and_cached
from tests.server_process import ServerProcess
from tests.tenant_keys import ALICE, BOB, keys_file


def test_claude_code_sessions_reuse_their_prefix(agent_clis, agent_server, tmp_path):
    claude = ClaudeCode(agent_clis, agent_server, tmp_path)
    first = claude.ask("What does this project do?")
    assert first["result"] == REPLY
    prompt, cached = prompt_and_cached(first)
    assert cached < 64 and prompt > 10_000  # a real agent prompt: system prompt, tools, environment

    # A new session shares the system prompt and tools (its billing header is normalized).
    second = claude.ask("Where are the tests?")
    prompt2, cached2 = prompt_and_cached(second)
    assert cached2 >= 0.5 * prompt2, (prompt2, cached2)

    # --continue resends the second session and its answer: nearly all of it is restored.
    third = claude.ask("--continue", "And the benchmarks?")
    prompt3, cached3 = prompt_and_cached(third)
    assert third["result"] == REPLY
    assert cached3 >= 0.95 * prompt3, (prompt3, cached3)
    assert prompt3 > prompt2

    metrics = _get(agent_server, "/metrics")
    assert 'omlx_prompt_normalizations_total{rule="claude_code_billing_header"}' in metrics
    log = agent_server.read_log()
    assert "POST /v1/messages?beta=true" in log and not failed_requests(log)
    _report(
        "claude-code",
        [first, second, third],
        [prompt_and_cached(r) for r in (first, second, third)],
    )


class Codex:
    """``codex exec`` with omlx as a Responses provider, in its own CODEX_HOME and project."""

    def __init__(self, bin_dir: Path, server, work: Path) -> None:
        self.exe = str(bin_dir / "codex")
        self.home, self.project = work / "codex-home", work / "project"
        self.home.mkdir(parents=True, exist_ok=True)
        self.project.mkdir(parents=True, exist_ok=True)
        # The settings `omlx launch codex` writes (docs/clients/codex.md): one place knows them.
        setup = codex_setup(Endpoint(server.base_url, "unused", MODEL_ID, CONTEXT), self.home)
        for path, text in setup.files.items():
            path.write_text(text)
        self.env = {"PATH": os.environ["PATH"], "HOME": str(work), **setup.env}

    def run(self, *args: str) -> list[dict]:
        done = subprocess.run(
            [self.exe, "exec", "--skip-git-repo-check", "--json", *args],
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, (
            f"codex exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        errors = [e for e in events if e.get("type") in ("error", "turn.failed")]
        assert not errors, errors
        return events


def _answer(events: list[dict]) -> str:
    return "".join(
        e["item"]["text"]
        for e in events
        if e.get("type") == "item.completed" and e["item"]["type"] == "agent_message"
    )


def test_codex_sessions_run_on_the_responses_api_and_reuse_their_prefix(
    agent_clis, agent_server, tmp_path
):
    codex = Codex(agent_clis, agent_server, tmp_path)
    first = codex.run("What does this project do?")
    assert _answer(first) == REPLY
    second = codex.run("resume", "--last", "And the tests?")
    assert _answer(second) == REPLY
    turns = finished_requests(agent_server.read_log())[-2:]
    (p1, c1), (p2, c2) = turns
    assert p1 > 5_000 and p2 > p1  # Codex's instructions and tools, then the whole history
    assert c2 >= 0.95 * p1, turns  # turn 2 restores turn 1's prompt (and its answer)
    log = agent_server.read_log()
    assert "POST /v1/responses" in log and not failed_requests(log)
    t1, t2 = _first_token_seconds(log)[-2:]  # codex exec reports no TTFT: the server's own
    print(
        f"codex turn 1: prompt {p1} tokens, cached {c1}, ttft {t1 * 1000:.0f} ms; "
        f"turn 2: prompt {p2}, cached {c2}, ttft {t2 * 1000:.0f} ms"
    )


def _first_token_seconds(log: str) -> list[float]:
    """Each finished request's time to first token, from the engine's log lines."""
    import re

    return [
        float(m.group(1))
        for m in re.finditer(r"request \d+ \(\S+\) \w+: .*, first token ([\d.]+) s", log)
    ]


def _get(server, path: str) -> str:
    import httpx

    return httpx.get(server.base_url + path, timeout=10).text


def _report(name: str, results: list[dict], usage: list[tuple[int, int]]) -> None:
    """One line per turn for the test log: prompt tokens, cached tokens, the CLI's own TTFT."""
    for i, (result, (prompt, cached)) in enumerate(zip(results, usage, strict=True), 1):
        print(
            f"{name} turn {i}: prompt {prompt} tokens, cached {cached}, ttft {result.get('ttft_ms')} ms"
        )


def test_the_clis_work_as_tenants_and_do_not_share_a_tenant_s_cache(
    agent_clis, agent_model_dir, tmp_path
):
    """Claude Code and Codex on a server with a keys file: each with its tenant's key, every
    request answered; a second tenant's first session restores nothing of the first's."""
    keys = keys_file(tmp_path, operator=False)
    with ServerProcess(
        "--model", str(agent_model_dir), "--log-level", "debug", "--api-keys-file", str(keys),
        cache_dir=tmp_path / "cache", log_path=tmp_path / "server.log",
    ) as server:  # fmt: skip
        claude = ClaudeCode(agent_clis, server, tmp_path / "alice")
        claude.env["ANTHROPIC_API_KEY"] = ALICE
        assert claude.ask("What does this project do?")["result"] == REPLY
        again = claude.ask("Where are the tests?")
        prompt, cached = prompt_and_cached(again)
        assert cached >= 0.5 * prompt, (prompt, cached)  # alice's own system prompt and tools
        other = ClaudeCode(agent_clis, server, tmp_path / "bob")
        other.env["ANTHROPIC_API_KEY"] = BOB
        prompt_b, cached_b = prompt_and_cached(other.ask("What does this project do?"))
        assert prompt_b > 10_000 and cached_b < 64, (prompt_b, cached_b)  # none of alice's
        codex = Codex(agent_clis, server, tmp_path / "bob-codex")
        codex.env["OMLX_API_KEY"] = BOB  # the provider's env_key
        assert _answer(codex.run("What does this project do?")) == REPLY
        log = server.read_log()
        assert "POST /v1/messages?beta=true" in log and "POST /v1/responses" in log
        assert not failed_requests(log)

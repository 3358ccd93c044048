"""Claude Code (from npm, installed into ``.agents/`` by ``scripts/install-agents.sh``) run
against a real ``omlx serve``, and what the server's log says of each request it made."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path


class ClaudeCode:
    """``claude -p`` in one HOME and project folder (sessions persist there, for --continue)."""

    def __init__(self, bin_dir: Path, server, work: Path) -> None:
        self.exe = str(bin_dir / "claude")
        self.home, self.project = work / "home", work / "project"
        self.home.mkdir(parents=True, exist_ok=True)
        self.project.mkdir(parents=True, exist_ok=True)
        self.env = {
            "PATH": os.environ["PATH"],
            "HOME": str(self.home),
            "ANTHROPIC_BASE_URL": server.base_url,  # nothing else: the model names are its own
            "ANTHROPIC_API_KEY": "sk-omlx-test",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
        }

    def ask(self, *args: str) -> dict:
        done = subprocess.run(
            [self.exe, "-p", *args, "--output-format", "json"],
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (
            f"claude exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
        result = json.loads(done.stdout)
        assert result["is_error"] is False and result.get("api_error_status") is None, result
        return result


def prompt_and_cached(result: dict) -> tuple[int, int]:
    usage = result["usage"]
    cached = usage["cache_read_input_tokens"]
    written = usage.get("cache_creation_input_tokens") or 0  # up to its last breakpoint
    return usage["input_tokens"] + written + cached, cached


def failed_requests(log: str) -> list[str]:
    """Access-log lines of requests answered with a 4xx or 5xx."""
    return re.findall(r'"[A-Z]+ \S+ HTTP/1\.1" [45]\d\d.*', log)


def finished_requests(log: str) -> list[tuple[int, int]]:
    """(prompt tokens, cached tokens) of each finished request, from the engine's log lines."""
    return [
        (int(m.group(1)), int(m.group(2)))
        for m in re.finditer(r"request \d+ \(\S+\) \w+: prompt (\d+) tokens, (\d+) cached", log)
    ]

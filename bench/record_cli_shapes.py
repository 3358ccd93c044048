"""Record the shapes of what the real Claude Code and Codex CLIs send: sizes, not their text.

    .venv/bin/python bench/record_cli_shapes.py [--out bench/traces/cli_shapes.json]

Each CLI (``.agents/``, ``scripts/install-agents.sh``) is pointed at a local HTTP server
that records every request body and answers it with an error, so the CLI gives up after
its first attempts. Kept per request: the endpoint, the model name asked for, the sizes
(characters and SmolLM2 tokens) of its system prompt, of each tool definition and of its
messages. The trace (``agent_trace.py``) builds requests of those sizes from this
repository's own text: it replays the CLIs' shapes without copying their prose.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".agents" / "node_modules" / ".bin"
TRACES = ROOT / "bench" / "traces"


class _Recorder(BaseHTTPRequestHandler):
    bodies: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def do_GET(self) -> None:
        self._answer(200, {"object": "list", "data": []})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        with contextlib.suppress(ValueError):
            self.bodies.append((self.path, json.loads(raw)))
        error = {"type": "error", "error": {"type": "invalid_request_error", "message": "recorded"}}
        self._answer(400, error)

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def _text_of(content: Any) -> str:
    """The text of an Anthropic / Responses content field (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            _text_of(p.get("text", p.get("content", ""))) for p in content if isinstance(p, dict)
        )
    return ""


def shape_of(path: str, body: dict[str, Any], tokenizer: Tokenizer) -> dict[str, Any]:
    """Sizes of one recorded request: system prompt, each tool, each message (chars, tokens)."""

    def size(text: str) -> dict[str, int]:
        return {
            "chars": len(text),
            "tokens": len(tokenizer.encode(text, add_special_tokens=False).ids),
        }

    system = _text_of(body.get("system") or body.get("instructions") or "")
    items = body.get("messages") or body.get("input") or []
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    return {
        "endpoint": path.split("?")[0],
        "model": body.get("model"),
        "max_tokens": body.get("max_tokens") or body.get("max_output_tokens"),
        "system": size(system),
        "tools": [
            {"name": t.get("name") or (t.get("function") or {}).get("name"), **size(json.dumps(t))}
            for t in body.get("tools") or []
        ],
        "messages": [
            {"role": i.get("role", i.get("type")), **size(_text_of(i.get("content", "")))}
            for i in items
            if isinstance(i, dict)
        ],
    }


def record(cli: str, argv: list[str], env: dict[str, str], work: Path) -> list[tuple[str, dict]]:
    """Run one CLI against a fresh recorder; the request bodies it sent."""
    _Recorder.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    home = work / cli
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        **{k: v.format(url=url, home=home) for k, v in env.items()},
    }
    if cli == "codex":
        (home / "config.toml").write_text(
            'model = "agent"\nmodel_provider = "rec"\n\n[model_providers.rec]\nname = "rec"\n'
            f'base_url = "{url}/v1"\nwire_api = "responses"\nrequest_max_retries = 0\n'
            "stream_max_retries = 0\n"
        )
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL
        )
    server.shutdown()
    return list(_Recorder.bodies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TRACES / "cli_shapes.json")
    parser.add_argument(
        "--tokenizer", type=Path, default=Path("/tmp/omlx-bench/smollm2-mlx/tokenizer.json")
    )
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(str(args.tokenizer))
    work = Path("/tmp/omlx-bench/cli-shapes")
    runs = {
        "claude-code": (
            [str(BIN / "claude"), "-p", "Where are the tests of this project?"],
            {
                "ANTHROPIC_BASE_URL": "{url}",
                "ANTHROPIC_API_KEY": "sk-record",
                "CLAUDE_CODE_MAX_RETRIES": "0",
                "DISABLE_AUTOUPDATER": "1",
            },
        ),
        "codex": (
            [
                str(BIN / "codex"),
                "exec",
                "--skip-git-repo-check",
                "Where are the tests of this project?",
            ],
            {"CODEX_HOME": "{home}"},
        ),
    }
    out: dict[str, Any] = {}
    for cli, (argv, env) in runs.items():
        bodies = record(cli, argv, env, work)
        out[cli] = [shape_of(p, b, tokenizer) for p, b in bodies]
        print(f"{cli}: {len(bodies)} requests")
        for s in out[cli]:
            print(
                f"  {s['endpoint']} model={s['model']} system {s['system']['tokens']} tokens, "
                f"{len(s['tools'])} tools {sum(t['tokens'] for t in s['tools'])} tokens, "
                f"{len(s['messages'])} messages {sum(m['tokens'] for m in s['messages'])} tokens"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

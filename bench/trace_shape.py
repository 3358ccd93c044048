"""The interleaved agent trace: which requests a coding-agent session sends, in which order.

Sizes come from what the real CLIs sent (``traces/cli_shapes.json``, recorded by
``record_cli_shapes.py``): Claude Code's system prompt, tool definitions and first user
message for the main session, Codex's instructions and tools for the second session. The
text is this repository's own (docs and source), cut to those token counts, so every
server sees the same realistic bytes and no CLI prose is copied. ``scale`` shrinks every
size alike, for a machine that cannot prefill the real 24k-token first prompt in time.

The order (``build_trace``): a main session growing turn by turn with tool results; a
short side call (a title) after its first turn; a sub-agent (its own system prompt, three
turns) in the middle; a burst of side calls; a second, independent session alternating
with the main one; a restart of the server; a compaction (the conversation replaced by a
summary plus its tail); follow-ups after it. Standard library only.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = Path(__file__).resolve().parent / "traces" / "cli_shapes.json"

Message = dict[str, str]
Count = Callable[[str], int]


@dataclass(frozen=True)
class Step:
    """One request of the trace, and how to read its result."""

    label: str  # what the table shows: "main 3 (after the sub-agent)"
    session: str  # main, sub-agent, side, second
    after: str  # for main turns: cold, follow-up, sub-agent, side calls, second session, restart, compaction
    messages: list[Message]
    max_tokens: int = 4
    restart_before: bool = False
    shared_with_previous: list[Message] = field(
        default_factory=list
    )  # main turns: the messages both share


class TextSource:
    """Consecutive slices of this repository's text, cut to a token count (deterministic).

    The text is README, docs and source as of ``commit`` (the working tree when None):
    pin it, or every edit to the docs changes the trace's bytes between two runs.
    """

    def __init__(self, count: Count, root: Path = ROOT, commit: str | None = None) -> None:
        self._text = "\n".join(_texts(root, commit))
        self._pos = 0
        self._count = count

    def take(self, tokens: int) -> str:
        """The next ~``tokens`` tokens of text (whole lines), wrapping at the end."""
        out: list[str] = []
        have = 0
        while have < tokens:
            end = self._text.find("\n", self._pos)
            if end < 0:
                self._pos, end = 0, self._text.find("\n")
            line = self._text[self._pos : end + 1]
            self._pos = end + 1
            out.append(line)
            have += max(self._count(line), 1)
        return "".join(out)


def _texts(root: Path, commit: str | None) -> list[str]:
    """README.md, docs/*.md and src/omlx/**/*.py, in that order, from ``commit`` or the tree."""
    if commit is None:
        paths = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
        paths += sorted((root / "src" / "omlx").rglob("*.py"))
        return [p.read_text(errors="replace") for p in paths if p.is_file()]

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True
        ).stdout

    names = git("ls-tree", "-r", "--name-only", commit).splitlines()
    docs = sorted(
        n for n in names if n.startswith("docs/") and n.count("/") == 1 and n.endswith(".md")
    )
    src = sorted(
        (n for n in names if n.startswith("src/omlx/") and n.endswith(".py")),
        key=lambda n: Path(n).parts,
    )
    return [
        git("show", f"{commit}:{n}")
        for n in ["README.md", *docs, *src]
        if n == "README.md" or n in names
    ]


def load_shapes(path: Path = SHAPES) -> dict[str, dict]:
    """The recorded first request of each CLI (the largest one: every tool loaded)."""
    data = json.loads(path.read_text())
    return {cli: max(reqs, key=lambda r: len(r["tools"])) for cli, reqs in data.items()}


def _tools_text(source: TextSource, tools: list[dict], scale: float) -> str:
    """Tool definitions as JSON lines, each the recorded tool's size (scaled)."""
    lines = []
    for t in tools:
        lines.append(
            json.dumps(
                {
                    "name": t["name"] or "tool",
                    "description": source.take(max(8, int(t["tokens"] * scale))),
                }
            )
        )
    return "# Tools\n" + "\n".join(lines)


def _tool_call(i: int, name: str) -> Message:
    args = (
        {"path": f"src/omlx/domain/file_{i}.py"}
        if name == "Read"
        else {"command": f"pytest -q -k case_{i}"}
    )
    return {"role": "assistant", "content": json.dumps({"tool": name, "arguments": args})}


def build_trace(
    count: Count,
    scale: float = 1.0,
    tool_result_tokens: int = 600,
    main_turns: int = 12,
    shapes: dict[str, dict] | None = None,
    text_commit: str | None = None,
) -> list[Step]:
    """The whole trace: main-session turns, sub-agent, side calls, second session, restart, compaction.

    ``count`` tokenizes (the servers' tokenizer); ``scale`` multiplies the recorded prompt
    sizes; ``tool_result_tokens`` sizes each tool result (scaled too; Read results of this
    repository's files are 300-3,000 tokens).
    """
    shapes = shapes or load_shapes()
    src = TextSource(count, commit=text_commit)
    cc, codex = shapes["claude-code"], shapes["codex"]
    s = scale
    main_system = {
        "role": "system",
        "content": source_block(src, cc["system"]["tokens"], s)
        + "\n\n"
        + _tools_text(src, cc["tools"], s),
    }
    first_user = {
        "role": "user",
        "content": "\n".join(src.take(max(16, int(m["tokens"] * s))) for m in cc["messages"]),
    }
    result_tokens = max(32, int(tool_result_tokens * s))

    def tool_result(i: int) -> Message:
        return {"role": "user", "content": f"Tool result {i}:\n" + src.take(result_tokens)}

    steps: list[Step] = []
    main: list[Message] = [main_system, first_user]
    previous: list[Message] = []
    turn = 0

    def main_turn(after: str, restart: bool = False) -> None:
        nonlocal previous, turn
        turn += 1
        shared = _common_prefix(previous, main)
        steps.append(
            Step(
                f"main {turn} ({after})",
                "main",
                after,
                [dict(m) for m in main],
                restart_before=restart,
                shared_with_previous=shared,
            )
        )
        previous = [dict(m) for m in main]

    def grow(i: int) -> None:
        main.append(_tool_call(i, "Read" if i % 2 else "Bash"))
        main.append(tool_result(i))

    def side_call(what: str) -> None:
        # A short request of its own: a small system prompt, an excerpt, a few tokens out.
        side = [
            {
                "role": "system",
                "content": f"Write a {what} for this conversation. "
                + src.take(int(120 * max(s, 0.5))),
            },
            {"role": "user", "content": src.take(int(300 * max(s, 0.5)))},
        ]
        steps.append(Step(f"side call: {what}", "side", "", side))

    main_turn("cold")
    side_call("title")
    grow(1)
    main_turn("follow-up")
    grow(2)
    main_turn("follow-up")
    # A sub-agent: its own system prompt and tools (a third of the main one's), three turns.
    sub = [
        {
            "role": "system",
            "content": source_block(src, int(cc["system"]["tokens"] * 0.5), s)
            + "\n\n"
            + _tools_text(src, cc["tools"][: max(1, len(cc["tools"]) // 3)], s),
        },
        {"role": "user", "content": "Find where blocks are evicted. " + src.take(int(200 * s))},
    ]
    for i in range(3):
        steps.append(Step(f"sub-agent turn {i + 1}", "sub-agent", "", [dict(m) for m in sub]))
        sub += [_tool_call(100 + i, "Bash"), {"role": "user", "content": src.take(result_tokens)}]
    grow(3)
    main_turn("sub-agent")
    for what in ("summary", "safety check", "topic"):
        side_call(what)
    grow(4)
    main_turn("side calls")
    # A second, independent session (Codex's shape), alternating with the main one.
    second = [{"role": "system", "content": _tools_text(src, codex["tools"], s)}]
    second += [
        {"role": "user", "content": src.take(max(16, int(m["tokens"] * s)))}
        for m in codex["messages"]
    ]
    for j in range(2):
        steps.append(Step(f"second session turn {j + 1}", "second", "", [dict(m) for m in second]))
        second += [
            _tool_call(200 + j, "Bash"),
            {"role": "user", "content": src.take(result_tokens)},
        ]
        grow(5 + j)
        main_turn("second session")
    grow(7)
    main_turn("restart", restart=True)
    turn_no = 8
    while turn < main_turns - 3:
        grow(turn_no)
        turn_no += 1
        main_turn("follow-up")
    # The compaction: the conversation so far plus an instruction to summarize it, then
    # the conversation replaced by the summary and its last exchange.
    grow(turn_no)
    main.append({"role": "assistant", "content": "(compacting)"})
    main.append({"role": "user", "content": "Summarize the conversation so far for a handover."})
    main_turn("compaction request")
    tail = main[-4:-2]
    summary = {
        "role": "user",
        "content": "Summary of the earlier conversation:\n" + src.take(int(800 * s)),
    }
    main[:] = [main_system, summary, *tail]
    main_turn("compaction")
    for k in range(main_turns - turn):
        grow(turn_no + 1 + k)
        main_turn("follow-up")
    return steps


def source_block(src: TextSource, tokens: int, scale: float) -> str:
    return src.take(max(32, int(tokens * scale)))


def _common_prefix(a: list[Message], b: list[Message]) -> list[Message]:
    """The leading messages ``a`` and ``b`` share (what a prefix cache can reuse)."""
    out = []
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        out.append(x)
    return out


def chatml(messages: list[Message], generation_prompt: bool = True) -> str:
    """The default model's chat template (ChatML), as every server renders it."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if generation_prompt else "")

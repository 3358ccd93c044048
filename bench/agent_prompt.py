"""The agent conversation the TTFT benches replay: tool descriptions, source files, user turns.

``build_system_prompt`` fills a system prompt with whole lines of this repository's own
source up to a token budget, so every server sees the same long, realistic prefix.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[1]

TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file of the repository and return its text with line numbers.",
        "parameters": {
            "path": "string, relative to the repository root",
            "start_line": "integer, optional",
            "end_line": "integer, optional",
        },
    },
    {
        "name": "write_file",
        "description": "Replace the whole content of a file; creates folders as needed.",
        "parameters": {"path": "string", "content": "string"},
    },
    {
        "name": "edit_file",
        "description": "Replace one exact, unique occurrence of old_text by new_text in a file.",
        "parameters": {"path": "string", "old_text": "string", "new_text": "string"},
    },
    {
        "name": "grep",
        "description": "Search files for a regular expression; returns path:line:text matches.",
        "parameters": {
            "pattern": "string",
            "path": "string, a folder or file",
            "max_results": "integer",
        },
    },
    {
        "name": "run_tests",
        "description": "Run pytest on a path and return the summary and the first failures.",
        "parameters": {"path": "string", "keyword": "string, optional -k expression"},
    },
    {
        "name": "run_shell",
        "description": "Run a shell command in the repository root with a 60 s timeout.",
        "parameters": {"command": "string"},
    },
]

SOURCE_FILES = [
    "src/omlx/domain/cache/keys.py",
    "src/omlx/domain/cache/blocks.py",
    "src/omlx/domain/ports.py",
    "src/omlx/domain/cache/prefix_cache.py",
    "src/omlx/domain/cache/hot_tier.py",
    "src/omlx/domain/cache/eviction.py",
    "src/omlx/domain/cache/cold_tier.py",
    "src/omlx/adapters/mlx/cache/codec.py",
    "src/omlx/adapters/blockfiles/format.py",
    "src/omlx/adapters/blockfiles/store.py",
]

USER_TURNS = [
    "Look at keys.py above. What exactly does block_key hash? Answer in one sentence.",
    "Call read_file on src/omlx/domain/cache/blocks.py. Reply with the tool call as JSON only.",
    "Tool result: 70 lines; dataclasses NamespaceInfo, BlockMeta, StoredBlock, DecodedBlock. Which one is an index row?",
    "Call run_tests with path tests/unit. Reply with the tool call as JSON only.",
    "Tool result: 212 passed in 3.1 s. Summarize the state of the work in one line.",
    "Call grep for 'def lookup' in src/omlx/domain. Reply with the tool call as JSON only.",
    "Tool result: src/omlx/domain/cache/prefix_cache.py:104:    def lookup(self, tokens). What does it return?",
    "Call edit_file to add a docstring to PrefixCache.lookup. Reply with the tool call as JSON only.",
]

SYSTEM_HEAD = (
    "You are a coding agent working in the omlx repository, a local LLM server on MLX with a "
    "prefix KV cache in RAM and on disk. Answer briefly. To act, reply with exactly one tool "
    'call as a JSON object {"tool": NAME, "arguments": {...}}.\n\n# Tools\n'
)


def build_system_prompt(tokenizer: Tokenizer, context_tokens: int) -> tuple[str, list[str]]:
    """Tool descriptions plus whole lines of source files, up to about ``context_tokens`` tokens."""
    text = SYSTEM_HEAD + "\n".join(json.dumps(t) for t in TOOLS) + "\n\n# Files of the repository\n"
    budget = context_tokens - 40  # room for the chat template and the first user message
    used_files: list[str] = []

    def count(s: str) -> int:
        return len(tokenizer.encode(s, add_special_tokens=False).ids)

    if count(text) >= budget:
        raise SystemExit(f"--context-tokens {context_tokens} is below the tool descriptions alone")
    files = SOURCE_FILES + sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "src/omlx").rglob("*.py")
        if str(p.relative_to(ROOT)) not in SOURCE_FILES
    )
    for rel in files:
        path = ROOT / rel
        if not path.exists():
            continue
        header = f"\n## {rel}\n```python\n"
        if count(text + header) >= budget:
            break
        used_files.append(rel)
        text += header
        # Whole lines while they fit; counting the growing text keeps merges at the seams exact.
        lines = path.read_text().splitlines(keepends=True)
        lo, hi = 0, len(lines)  # largest prefix of lines that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count(text + "".join(lines[:mid]) + "```\n") <= budget:
                lo = mid
            else:
                hi = mid - 1
        text += "".join(lines[:lo]) + "```\n"
        if lo < len(lines):
            break
    return text, used_files

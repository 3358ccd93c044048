"""Agents' conversations as they grow, turn by turn, in each API's own request shapes.

Each is a list of (the model's answer to the previous turn, the client's new messages);
``conversation(turns, k)`` is what the client sends at turn ``k``. Claude Code's over
/v1/messages: system blocks with its billing header, its environment as a system message
after the first user turn, tool_use and tool_result, ``<system-reminder>`` text beside tool
results, a late system message after a tool result and one after an answer. OpenAI-shaped
system and developer messages mid-conversation over /v1/chat/completions. Codex's over
/v1/responses: developer messages first and mid-session, its environment as a user message.
"""

from __future__ import annotations

import json

HEADER = "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=cli; cch=1f2e3;"
TOOLS = [
    {
        "name": name,
        "description": f"{name} a file or command",
        "input_schema": {"type": "object", "properties": {"arg": {"type": "string"}}},
    }
    for name in ("Bash", "Read", "Edit")
]


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def tool_use(n: int, name: str) -> dict:
    return {"type": "tool_use", "id": f"toolu_{n:02d}Xq7Lm2Pz", "name": name, "input": {"arg": n}}


def result(n: int, content: str) -> dict:
    return {"type": "tool_result", "tool_use_id": f"toolu_{n:02d}Xq7Lm2Pz", "content": content}


def reminder(t: str) -> dict:
    return text(f"<system-reminder>\n{t}\n</system-reminder>")


def answer(*blocks: dict) -> dict:
    return {"role": "assistant", "content": list(blocks)}


# (the model's answer to the previous turn, then the client's new messages)
CLAUDE_CODE = [
    (
        None,
        [
            {"role": "user", "content": [reminder("Context: the repo"), text("Fix the test")]},
            {"role": "system", "content": [text("# Environment\nWorking directory: /w")]},
        ],
    ),
    (
        answer(text("I'll run the tests."), tool_use(1, "Bash")),
        [{"role": "user", "content": [result(1, "1 failed: test_add")]}],
    ),
    (
        answer(tool_use(2, "Read")),
        [
            {
                "role": "user",
                "content": [result(2, "def add(a, b): return a - b"), reminder("Todo list empty")],
            }
        ],
    ),
    (
        answer(tool_use(3, "Edit")),
        [
            {"role": "user", "content": [result(3, "The file was updated")]},
            {"role": "system", "content": "Tool loaded."},
        ],
    ),
    (
        answer(tool_use(4, "Bash"), tool_use(5, "Read")),
        [{"role": "user", "content": [result(4, "1 passed"), result(5, "return a + b")]}],
    ),
    (
        answer(text("Fixed: add subtracted.")),
        [
            {"role": "system", "content": [text("Plan mode is off.")]},
            {"role": "user", "content": [reminder("Be brief"), text("Now test negatives")]},
        ],
    ),
    (
        answer(tool_use(6, "Edit")),
        [
            {"role": "user", "content": [result(6, "The file was updated")]},
            {"role": "system", "content": "# Environment\nGit status: modified"},
        ],
    ),
]


def call(n: int, name: str) -> dict:
    arguments = json.dumps({"arg": n})
    function = {"name": name, "arguments": arguments}
    return {"id": f"call_{n:02d}Xq7Lm2Pz", "type": "function", "function": function}


def answer_calls(*calls: dict) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def tool_message(n: int, content: str) -> dict:
    return {"role": "tool", "tool_call_id": f"call_{n:02d}Xq7Lm2Pz", "content": content}


OPENAI = [
    (
        None,
        [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Fix the test"},
            {"role": "system", "content": "cwd: /w"},
        ],
    ),
    (
        answer_calls(call(1, "Bash")),
        [tool_message(1, "1 failed"), {"role": "system", "content": "Note"}],
    ),
    (
        answer_calls(call(2, "Read"), call(3, "Read")),
        [tool_message(2, "a.py"), tool_message(3, "b.py"), {"role": "user", "content": "hurry"}],
    ),
    (
        {"role": "assistant", "content": "Fixed."},
        [
            {"role": "developer", "content": "Approval mode: never"},
            {"role": "user", "content": "Now the docs"},
        ],
    ),
    (answer_calls(call(4, "Edit")), [tool_message(4, "updated")]),
    (
        {"role": "assistant", "content": "Done."},
        [{"role": "user", "content": "Thanks"}, {"role": "system", "content": "Session ends"}],
    ),
]
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
    for t in TOOLS
]


def fc(n: int, name: str) -> dict:
    return {
        "type": "function_call",
        "call_id": f"call_{n:02d}Xq7Lm2Pz",
        "name": name,
        "arguments": "{}",
    }


def fc_out(n: int, output: str) -> dict:
    return {"type": "function_call_output", "call_id": f"call_{n:02d}Xq7Lm2Pz", "output": output}


def said(role: str, t: str) -> dict:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": t}]}


# Codex's shape over /v1/responses: developer messages first and mid-session, its environment
# as a second user message, calls and their outputs.
CODEX = [
    (
        None,
        [
            said("developer", "<permissions>workspace-write</permissions>"),
            said("user", "<environment_context>cwd /w</environment_context>"),
            said("user", "Fix the test"),
        ],
    ),
    (fc(1, "shell"), [fc_out(1, "1 failed")]),
    (fc(2, "shell"), [fc_out(2, "def add"), said("developer", "Approval policy: never")]),
    (said("assistant", "Fixed."), [said("developer", "<turn_aborted/>"), said("user", "Docs")]),
    (fc(3, "apply_patch"), [fc_out(3, "Success")]),
    (said("assistant", "Done."), [said("user", "Thanks")]),
]
CODEX_TOOLS = [
    {"type": "function", "name": n, "parameters": {"type": "object"}}
    for n in ("shell", "apply_patch")
]


def conversation(turns, k: int) -> list[dict]:
    """Turn ``k``'s messages: every turn's new messages, each after the model's answer."""
    messages: list[dict] = []
    for answer, new in turns[: k + 1]:
        if answer is not None:
            messages.append(answer)
        messages += new
    return messages

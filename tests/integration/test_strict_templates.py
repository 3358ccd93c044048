"""Strict chat templates under agents' real request shapes, through the real app: each turn's
prompt tokens start with the whole previous turn's prompt, generation prompt included, for
the default (ChatML) template and the strict families (tests/strict_templates.py).

Claude Code's shapes over /v1/messages: system blocks with its billing header, its
environment as a system message after the first user turn, tool_use and tool_result,
<system-reminder> text in user turns beside tool results, a late system message after a
tool result and one after an answer. OpenAI-shaped system messages mid-conversation over
/v1/chat/completions; Codex's developer messages over /v1/responses. The engine is a fake that records the prompt tokens it is given.
"""

from __future__ import annotations

import itertools
import json

import pytest
from litestar.testing import TestClient

from omlx.adapters.mlx.models.tokenizer_loader import load_tokenizer
from omlx.app.api.app import create_app
from tests.strict_templates import FAMILIES, template_folder
from tests.unit.api_fakes import FakeEngine, FakeModel, fake_container, reply

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


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    folder = template_folder(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, load_tokenizer(folder)


def run(family, send) -> list[list[int]]:
    """Each turn's prompt tokens as the engine got them; ``send(client, turn)`` posts turn k."""
    name, tokenizer = family
    engine = FakeEngine(reply("ok"))
    model = FakeModel(tokenizer=tokenizer, model_id=name)
    with TestClient(create_app(fake_container(engine, model=model))) as client:
        for turn in itertools.count():
            response = send(client, turn)
            if response is None:
                break
            assert response.status_code == 200, response.text
    return [r.prompt_tokens for r in engine.submitted]


def conversation(turns, k: int) -> list[dict]:
    """Turn ``k``'s messages: every turn's new messages, each after the model's answer."""
    messages: list[dict] = []
    for answer, new in turns[: k + 1]:
        if answer is not None:
            messages.append(answer)
        messages += new
    return messages


def assert_each_turn_extends_the_previous(prompts, tokenizer, texts) -> None:
    for n, (before, after) in enumerate(itertools.pairwise(prompts), start=1):
        assert after[: len(before)] == before, (
            f"turn {n + 1} rewrote turn {n}'s prompt from token "
            f"{next(i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b)}:\n"
            f"{tokenizer.decode(before)!r}\n{tokenizer.decode(after)!r}"
        )
    last = tokenizer.decode(prompts[-1])
    for t in texts:  # every message reached the model
        assert t in last, t


def test_claude_code_turns_each_extend_the_previous_prompt(family):
    def send(client, k):
        if k == len(CLAUDE_CODE):
            return None
        body = {
            "model": "claude-opus-5-5",
            "max_tokens": 8,
            "system": [text(HEADER), text("You are an agent.")],
            "messages": conversation(CLAUDE_CODE, k),
            "tools": TOOLS,
        }
        return client.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})

    prompts = run(family, send)
    assert len(prompts) == len(CLAUDE_CODE)
    texts = ["You are an agent.", "Working directory: /w", "Tool loaded.", "Plan mode is off."]
    texts += ["Todo list empty", "Now test negatives", "Git status: modified", "return a + b"]
    assert_each_turn_extends_the_previous(prompts, family[1], texts)


def test_openai_system_messages_mid_conversation_each_extend_the_previous_prompt(family):
    def send(client, k):
        if k == len(OPENAI):
            return None
        body = {
            "model": family[0],
            "max_tokens": 8,
            "messages": conversation(OPENAI, k),
            "tools": OPENAI_TOOLS,
        }
        return client.post("/v1/chat/completions", json=body)

    prompts = run(family, send)
    assert len(prompts) == len(OPENAI)
    texts = ["You are a coding agent.", "cwd: /w", "Note", "hurry", "Approval mode: never"]
    texts += ["Now the docs", "Session ends", "b.py"]
    assert_each_turn_extends_the_previous(prompts, family[1], texts)


def test_codex_developer_messages_mid_session_each_extend_the_previous_prompt(family):
    def send(client, k):
        if k == len(CODEX):
            return None
        body = {
            "model": family[0],
            "instructions": "You are Codex.",
            "input": conversation(CODEX, k),
            "tools": CODEX_TOOLS,
            "max_output_tokens": 8,
            "store": False,
        }
        return client.post("/v1/responses", json=body)

    prompts = run(family, send)
    assert len(prompts) == len(CODEX)
    texts = ["You are Codex.", "workspace-write", "cwd /w", "Approval policy: never"]
    texts += ["<turn_aborted/>", "Docs", "Success", "Thanks"]
    assert_each_turn_extends_the_previous(prompts, family[1], texts)

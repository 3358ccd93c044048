"""The scripted LLaVA (``tests/scripted_vlm.py``) loaded by omlx's own loader: its greedy
output follows the script on each kind of turn Claude Code makes, and the pictures'
rows, written over their positions, change nothing after them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "mlx_vlm",
    reason="the vision extra (pip install -e '.[vision]'; scripts/setup-test.sh installs it)",
)

import mlx.core as mx

from omlx.adapters.mlx.models.loader import load_model
from omlx.domain.cache.image_keys import IMAGE_ID_BASE
from omlx.domain.images import PromptImage
from tests.scripted_vlm import ANSWER, REPLY, build_scripted_vlm, read_call

PNG = Path("/project/shot.png")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Read",
            "description": "Read a file from the local filesystem.",
            "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}}},
        },
    }
]
CALL = {
    "id": "toolu_1",
    "type": "function",
    "function": {"name": "Read", "arguments": {"file_path": str(PNG)}},
}
ASK = {"role": "user", "content": "Look at shot.png"}
CALLED = {"role": "assistant", "content": "", "tool_calls": [CALL]}
PICTURE = {"role": "tool", "tool_call_id": "toolu_1", "content": [{"type": "image"}]}


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    return load_model(str(build_scripted_vlm(tmp_path_factory.mktemp("svlm") / "svlm", PNG)))


def picture(seed: int) -> PromptImage:
    pixels = np.random.default_rng(seed).integers(0, 255, (30, 40, 3), dtype=np.uint8)
    return PromptImage.of(40, 30, pixels.tobytes(), f"picture {seed}")


def prompt(vlm, messages, images=(), tools=TOOLS) -> list[int]:
    text = vlm.tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    return vlm.extra["vision"].key_tokens(text, list(images))


def greedy(vlm, tokens: list[int], limit: int = 8) -> tuple[str, mx.array]:
    """The greedy text up to the end of turn, and the prompt's last logits."""
    cache = vlm.model.make_cache()
    logits = vlm.model(mx.array([tokens]), cache=cache)[0, -1]
    first, out = logits, []
    for _ in range(limit):
        token = int(mx.argmax(logits).item())
        if token in vlm.tokenizer.eos_token_ids:
            return vlm.tokenizer.decode(out), first
        out.append(token)
        logits = vlm.model(mx.array([[token]]), cache=cache)[0, -1]
    raise AssertionError(f"no end of turn after {limit} tokens: {vlm.tokenizer.decode(out)!r}")


def test_it_calls_read_then_answers_after_the_picture_then_replies(vlm):
    said, _ = greedy(vlm, prompt(vlm, [ASK]))
    assert said == f"<tool_call>{read_call(PNG)}</tool_call>"
    tokens = prompt(vlm, [ASK, CALLED, PICTURE], [picture(1)])
    assert sum(t >= IMAGE_ID_BASE for t in tokens) == 16
    assert greedy(vlm, tokens)[0] == ANSWER
    # A resized picture comes with a note after the tool result, in the same user turn.
    note = {"role": "user", "content": "[Image: original 2560x1600, displayed at 2000x1250.]"}
    assert greedy(vlm, prompt(vlm, [ASK, CALLED, PICTURE, note], [picture(1)]))[0] == ANSWER
    answered = {"role": "assistant", "content": ANSWER}
    follow = {"role": "user", "content": "Which colour dominates?"}
    history = [ASK, CALLED, PICTURE, answered, follow]
    assert greedy(vlm, prompt(vlm, history, [picture(1)]))[0] == REPLY
    assert greedy(vlm, prompt(vlm, [ASK], tools=None))[0] == REPLY  # a side request


def test_a_follow_up_prompt_extends_the_previous_prompt_and_answer(vlm):
    """What makes Claude Code's next request restore all of the previous one."""
    first = prompt(vlm, [ASK])
    said = vlm.tokenizer.encode(
        f"<tool_call>{read_call(PNG)}</tool_call>", add_special_tokens=False
    )
    second = prompt(vlm, [ASK, CALLED, PICTURE], [picture(1)])
    assert second[: len(first) + len(said)] == first + said


def test_the_pictures_rows_do_not_reach_the_next_token(vlm):
    tokens = {seed: prompt(vlm, [ASK, CALLED, PICTURE], [picture(seed)]) for seed in (1, 2)}
    rows = {
        seed: vlm.extra["vision"].rows.rows_at(next(t for t in ids if t >= IMAGE_ID_BASE))[0]
        for seed, ids in tokens.items()
    }
    assert float(mx.abs(rows[1] - rows[2]).max()) > 1e-3  # two pictures, two sets of rows
    _, last1 = greedy(vlm, tokens[1])
    _, last2 = greedy(vlm, tokens[2])
    assert mx.array_equal(last1, last2)  # the zero attention and MLP outputs see to it

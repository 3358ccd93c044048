"""Vision-language models through the engine and the prefix cache (issue 35).

Tiny random-weight VLMs of each family the tests build (``tests/vlm_models.py``), real
PNG-like pixels: a conversation's greedy text is the same with the cache as without it
(hit == miss), a turn that adds a second image restores every block before it, the same
position with another image misses from the block that holds it, and an image seen
before costs no encoder pass.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "mlx_vlm", reason="the vision extra (pip install -e '.[vision]'; scripts/setup.sh installs it)"
)

from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.models.loader import load_model
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.image_keys import IMAGE_ID_BASE
from omlx.domain.cache.prefix_cache import PrefixCache
from omlx.domain.generation import GenerationRequest, SamplingParams
from omlx.domain.images import PromptImage
from tests.engine_helpers import generate
from tests.vlm_models import VLM_FAMILIES, build_vlm

BLOCK = 16
STEP = 48
SYSTEM = "You are a careful assistant who describes screenshots. " * 4


def picture(seed: int, width: int = 40, height: int = 30) -> PromptImage:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    return PromptImage.of(width, height, pixels.tobytes(), f"image {seed}")


SERVED = [f for f in VLM_FAMILIES if f != "qwen2_vl"]  # M-RoPE: refused at load (below)


@pytest.fixture(scope="module", params=SERVED)
def vlm(request, tmp_path_factory):
    return load_model(str(build_vlm(request.param, tmp_path_factory.mktemp(request.param))))


def prefix_cache(model) -> PrefixCache:
    return PrefixCache(
        namespace=model.namespace(BLOCK),
        codec=MLXKVCodec(model.layout),
        hot=HotTier(1 << 30),
        layout=model.layout.domain,
    )


def engine(model, cache):
    e = MLXEngine(model, cache, EngineConfig(prefill_step_size=STEP))
    e.start()
    return e


def user(text: str, images: int = 0) -> dict:
    if not images:
        return {"role": "user", "content": text}
    return {
        "role": "user",
        "content": [*({"type": "image"} for _ in range(images)), {"type": "text", "text": text}],
    }


def prompt_of(model, messages, images):
    text = model.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return model.extra["vision"].key_tokens(text, images)


def ask(model, eng, messages, images, max_tokens: int = 8):
    tokens = prompt_of(model, messages, images)
    request = GenerationRequest(
        tuple(tokens), max_tokens, SamplingParams(temperature=0.0), images=tuple(images)
    )
    run = generate(eng, request)
    return run.text, len(tokens), run.finished.cached_tokens, tokens


def conversation(model, eng, first, second):
    """Four turns: an image at turn 1, another at turn 3; what each turn said and restored."""
    messages = [{"role": "system", "content": SYSTEM}]
    images: list[PromptImage] = []
    out = []
    for text, image in (
        ("What is on this screen?", first),
        ("Which colour dominates?", None),
        ("And this second one?", second),
        ("Compare them.", None),
    ):
        if image is not None:
            images.append(image)
        messages.append(user(text, 1 if image is not None else 0))
        answer = ask(model, eng, messages, images)
        out.append(answer)
        messages.append({"role": "assistant", "content": answer[0]})
    return out


def test_key_tokens_give_each_image_its_own_ids(vlm):
    one, two = picture(1), picture(2)
    messages = [user("Look.", 1)]
    a = prompt_of(vlm, messages, [one])
    b = prompt_of(vlm, messages, [two])
    assert len(a) == len(b)
    image_a = [t for t in a if t >= IMAGE_ID_BASE]
    assert image_a and len(set(image_a)) == len(image_a)  # consecutive, distinct
    assert not set(image_a) & {t for t in b if t >= IMAGE_ID_BASE}
    assert [t for t in a if t < IMAGE_ID_BASE] == [t for t in b if t < IMAGE_ID_BASE]


def test_image_conversations_hit_equals_miss_and_restore_before_a_new_image(vlm):
    assert vlm.cache_supported, vlm.cache_unsupported_reason
    first, second = picture(10), picture(20)
    plain = engine(vlm, None)
    try:
        want = conversation(vlm, plain, first, second)
    finally:
        plain.stop()
    rows = vlm.extra["vision"].rows
    rows.clear()
    passes = rows.encoder_passes
    cache = prefix_cache(vlm)
    eng = engine(vlm, cache)
    try:
        got = conversation(vlm, eng, first, second)
        assert [g[0] for g in got] == [w[0] for w in want]  # hit == miss, every turn
        # Every turn after the first restores what it shares with the one before: the
        # turn adding the second image included (at least up to the last full block).
        for (_, length, cached, _), (_, prev_len, _, _) in zip(got[1:], got, strict=False):
            # Token-granular: all of the previous turn (a windowed model: but its last token,
            # whose window state is captured before it).
            assert cached >= prev_len - 1, (cached, prev_len, length)
        # Two images, one encoder pass each: later turns reuse their rows or their KV.
        assert rows.encoder_passes - passes == 2
        # The same conversation again: all from the cache, no encoder pass at all.
        again = conversation(vlm, eng, first, second)
        assert [g[0] for g in again] == [w[0] for w in want]
        assert rows.encoder_passes - passes == 2
        # Another second image: the turns before it are restored, the image itself is not.
        other = conversation(vlm, eng, first, picture(30))
        assert [g[0] for g in other[:2]] == [w[0] for w in want[:2]]
        # Its third turn restores what comes before the new image (to the last block
        # boundary, or a windowed model's last restore point, one per prefill chunk at
        # most STEP back) and nothing of the new image's tokens.
        tokens = other[2][3]
        new_image = next(i for i in range(got[1][1], len(tokens)) if tokens[i] >= IMAGE_ID_BASE)
        assert new_image - STEP <= other[2][2] <= new_image
    finally:
        eng.stop()


def test_a_multimodal_rope_model_is_refused_at_load_saying_why(tmp_path):
    from omlx.adapters.mlx.models.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="M-RoPE"):
        load_model(str(build_vlm("qwen2_vl", tmp_path / "qwen2_vl")))

"""Vision-language models through the engine and the prefix cache (issue 35).

Tiny random-weight VLMs of each family the tests build (``tests/vlm_models.py``), real
PNG-like pixels: the engine's greedy text equals mlx-vlm's own generation of the same
prompt, chunked or not, alone or batched with another request's images; a conversation's
greedy text is the same with the cache as without it (hit == miss), a turn that adds a
second image restores every block before it, the same position with another image misses
from the block that holds it, and an image seen before costs no encoder pass. Qwen2-VL and
Qwen2.5-VL place image tokens with M-RoPE: their position plans equal mlx-vlm's
``get_rope_index``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip(
    "mlx_vlm",
    reason="the vision extra (pip install -e '.[vision]'; scripts/setup-test.sh installs it)",
)

from PIL import Image

from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.models.loader import load_model
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.image_keys import IMAGE_ID_BASE
from omlx.domain.cache.prefix_cache import PrefixCache
from omlx.domain.generation import GenerationRequest, PrefillProgress, SamplingParams, TextDelta
from omlx.domain.images import PromptImage
from tests.engine_helpers import Run, generate, submit
from tests.vlm_models import VLM_FAMILIES, build_vlm

BLOCK = 16
STEP = 48
SYSTEM = "You are a careful assistant who describes screenshots. " * 4


def picture(seed: int, width: int = 40, height: int = 30) -> PromptImage:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    return PromptImage.of(width, height, pixels.tobytes(), f"image {seed}")


MROPE = ("qwen2_vl", "qwen2_5_vl")  # image positions from their grids (vision/mrope.py)


@pytest.fixture(scope="module", params=VLM_FAMILIES)
def vlm(request, tmp_path_factory):
    return load_model(str(build_vlm(request.param, tmp_path_factory.mktemp(request.param))))


@pytest.fixture(scope="module", params=MROPE)
def mrope_vlm(request, tmp_path_factory):
    return load_model(str(build_vlm(request.param, tmp_path_factory.mktemp(request.param))))


def prefix_cache(model) -> PrefixCache:
    return PrefixCache(
        namespace=model.namespace(BLOCK),
        codec=MLXKVCodec(model.layout),
        hot=HotTier(1 << 30),
        layout=model.layout.domain,
    )


def engine(model, cache, step: int = STEP, start: bool = True):
    e = MLXEngine(model, cache, EngineConfig(prefill_step_size=step))
    if start:
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


def request_of(model, messages, images, max_tokens: int = 8) -> GenerationRequest:
    tokens = prompt_of(model, messages, images)
    return GenerationRequest(
        tuple(tokens), max_tokens, SamplingParams(temperature=0.0), images=tuple(images)
    )


def ask(model, eng, messages, images, max_tokens: int = 8):
    request = request_of(model, messages, images, max_tokens)
    run = generate(eng, request)
    return run.text, len(request.prompt_tokens), run.finished.cached_tokens, request.prompt_tokens


def two_images() -> tuple[list[dict], list[PromptImage]]:
    """A system prompt, then two images of different shapes (grids) with text around them."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "text", "text": "and"},
                {"type": "image"},
                {"type": "text", "text": "What differs?"},
            ],
        },
    ]
    return messages, [picture(3), picture(4, 200, 60)]


def mlx_vlm_greedy(model, messages, images, max_tokens: int) -> list[int]:
    """What mlx-vlm itself generates for the same prompt and images (its own model object,
    processor and generation loop; the processed tensors passed as the unit tests do)."""
    import mlx.core as mx
    import mlx_vlm
    from mlx_vlm.utils import load

    vlm, processor = load(str(model.path))
    text = model.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    pictures = [Image.frombytes("RGB", (i.width, i.height), i.rgb) for i in images]
    inputs = processor(text=[text], images=pictures, return_tensors="np")
    extra = {
        k: mx.array(v)
        for k, v in inputs.items()
        if k not in ("input_ids", "pixel_values", "attention_mask")
    }
    tokens = [
        r.token
        for r in mlx_vlm.stream_generate(
            vlm,
            processor,
            text,
            input_ids=mx.array(inputs["input_ids"]),
            pixel_values=mx.array(inputs["pixel_values"]),
            mask=mx.array(inputs["attention_mask"]),
            max_tokens=max_tokens,
            temperature=0.0,
            **extra,
        )
    ][:max_tokens]
    eos = set(model.tokenizer.eos_token_ids)
    return [t for t in tokens if t not in eos]


def token_ids(run) -> list[int]:
    """The tokens a run handed out (its request asked for logprobs: they name them)."""
    return [lp.token for e in run.events if isinstance(e, TextDelta) for lp in e.logprobs]


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


def test_greedy_tokens_with_images_equal_mlx_vlms_own_generation(vlm):
    """The strongest check that the engine places image rows and positions right: chunks
    of STEP tokens (boundaries inside the images) against mlx-vlm's whole-prompt pass."""
    messages, images = two_images()
    request = replace(request_of(vlm, messages, images, max_tokens=10), logprobs=0)
    plain = engine(vlm, None)
    try:
        run = generate(plain, request)
    finally:
        plain.stop()
    # Token ids, not text: a random model's bytes need not make UTF-8, and a streaming
    # detokenizer may render a broken sequence otherwise than a whole decode.
    want = mlx_vlm_greedy(vlm, messages, images, 10)
    assert len(want) >= 5 and token_ids(run) == want


def test_a_chunked_prefill_equals_an_unchunked_one(vlm):
    messages, images = two_images()
    said = []
    for step in (16, 1024):  # 16: every block its own chunk; 1024: the prompt in one
        e = engine(vlm, None, step=step)
        try:
            said.append(generate(e, request_of(vlm, messages, images, max_tokens=10)).text)
        finally:
            e.stop()
    assert said[0] == said[1]


def test_two_requests_with_different_images_batched_together_each_equal_their_solo_run(vlm):
    """Two rows restored to different points (one past its image, one to the shared system
    prompt, before its two images), different images (for M-RoPE: different grids, so
    different position shifts), prefilled and decoded in one batch."""
    first = [
        {"role": "system", "content": SYSTEM},
        user("What is on this screen?", 1),
    ]
    followup = [*first, {"role": "assistant", "content": "A chart."}, user("Which colour?")]
    other, other_images = two_images()
    requests = [
        request_of(vlm, followup, [picture(5, 64, 48)]),
        request_of(vlm, other, other_images),
    ]
    plain = engine(vlm, None)
    try:
        solo = [generate(plain, r).text for r in requests]
    finally:
        plain.stop()
    cache = prefix_cache(vlm)
    e = engine(vlm, cache)
    try:
        ask(vlm, e, first, [picture(5, 64, 48)])  # the follow-up's prefix, into the cache
    finally:
        e.stop()
    e = engine(vlm, cache, start=False)  # both waiting when it starts: admitted together
    runs = [submit(e, r) for r in requests]
    e.start()
    try:
        for run in runs:
            assert run.done.wait(120), "generation timed out"
    finally:
        e.stop()
    assert [run.text for run in runs] == solo
    image_at = [
        next(i for i, t in enumerate(r.prompt_tokens) if t >= IMAGE_ID_BASE) for r in requests
    ]
    assert runs[0].finished.cached_tokens > image_at[0]  # its image came from the cache
    assert 0 < runs[1].finished.cached_tokens <= image_at[1]  # its images ran in the batch


def test_a_prefill_cancelled_inside_an_image_resumes_there_with_the_same_text(vlm):
    """A client that left in the middle of an image's prefill comes back: the retry
    restores what was computed, up to a chunk end inside the image, and goes on from there
    (for M-RoPE: the image's remaining tokens at the positions of its grid)."""
    messages, images = two_images()
    request = request_of(vlm, messages, images, max_tokens=10)
    tokens = request.prompt_tokens
    first = next(i for i, t in enumerate(tokens) if t >= IMAGE_ID_BASE)
    end = first
    while end < len(tokens) and tokens[end] == tokens[first] + (end - first):
        end += 1
    plain = engine(vlm, None)
    try:
        want = generate(plain, request).text
    finally:
        plain.stop()
    e = engine(vlm, prefix_cache(vlm), step=BLOCK)  # a chunk ends inside every image
    left = Run()

    def emit(event) -> None:
        left.emit(event)
        if isinstance(event, PrefillProgress) and first < event.done < end and not left.job_id:
            left.job_id = -1  # cancel once, from the engine's own thread, before the next chunk
            e.cancel(job)

    try:
        job = e.submit(request, emit)
        assert left.done.wait(120)
        assert left.job_id == -1, "the prefill was not cancelled inside the image"
        again = generate(e, request)
    finally:
        e.stop()
    if vlm.layout.domain.plain:  # a windowed model restores to its last restore point
        assert first < again.finished.cached_tokens < end
    assert again.text == want


def test_position_plans_equal_mlx_vlms_get_rope_index(mrope_vlm):
    import mlx.core as mx

    messages, images = two_images()
    text = mrope_vlm.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    tokens = mrope_vlm.extra["vision"].key_tokens(text, images)
    plan = mrope_vlm.model.position_plan(tokens)
    assert plan.images == 2
    vlm, processor = mrope_vlm.model.vlm, mrope_vlm.extra["vision"].processor
    pictures = [Image.frombytes("RGB", (i.width, i.height), i.rgb) for i in images]
    inputs = processor(text=[text], images=pictures, return_tensors="np")
    want, _ = vlm.language_model.get_rope_index(
        mx.array(inputs["input_ids"]),
        mx.array(inputs["image_grid_thw"]),
        None,
        mx.array(inputs["attention_mask"]),
    )
    np.testing.assert_array_equal(plan.positions(0, len(tokens)), np.array(want)[:, 0, :])


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


def test_a_multimodal_rope_family_omlx_does_not_plan_is_refused_at_load_saying_why(tmp_path):
    """Qwen3-VL (timestamps in its positions) and other M-RoPE families: a clear refusal."""
    from types import SimpleNamespace

    from omlx.adapters.mlx.models.errors import UnsupportedModelError
    from omlx.adapters.mlx.vision.loader import _multimodal_rope

    def language_model(get_rope_index: bool):
        return SimpleNamespace(get_rope_index=len) if get_rope_index else SimpleNamespace()

    def vlm(family: str, rope: bool = True):
        config = SimpleNamespace(model_type=family)
        return SimpleNamespace(config=config, language_model=language_model(rope))

    with pytest.raises(UnsupportedModelError, match="qwen3_vl places image tokens with multi"):
        _multimodal_rope(tmp_path, vlm("qwen3_vl"))
    assert _multimodal_rope(tmp_path, vlm("qwen2_5_vl")) is True
    assert _multimodal_rope(tmp_path, vlm("llava", rope=False)) is False

"""The tiny vision-language model folders of tests/vlm_models.py load and run in mlx-vlm."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "mlx_vlm",
    reason="the vision extra (pip install -e '.[vision]', scripts/setup-test.sh installs it)",
)

import mlx.core as mx
import numpy as np
from PIL import Image

from tests.vlm_models import VLM_FAMILIES, build_vlm, image_features

ONE_IMAGE = [
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}
]
TWO_IMAGES = [
    {
        "role": "user",
        "content": [
            {"type": "image"},
            {"type": "text", "text": "and"},
            {"type": "image"},
            {"type": "text", "text": "What is this?"},
        ],
    }
]


def _image(width: int, height: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


def _prompt(processor, messages) -> str:
    # Some mlx-vlm processors (llava, gemma3, idefics3) keep the template on the tokenizer.
    owner = processor if getattr(processor, "chat_template", None) else processor.tokenizer
    return owner.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _image_token_id(model) -> int:
    config = model.config
    index = getattr(config, "image_token_index", None)
    return index if index is not None else config.image_token_id


@pytest.fixture(scope="module", params=VLM_FAMILIES)
def loaded(request, tmp_path_factory):
    from mlx_vlm.utils import load

    folder = build_vlm(request.param, tmp_path_factory.mktemp(request.param) / "model")
    model, processor = load(str(folder))
    return request.param, model, processor


def test_image_tokens_match_features_and_greedy_generation_is_deterministic(loaded):
    import mlx_vlm

    family, model, processor = loaded
    prompt = _prompt(processor, ONE_IMAGE)
    inputs = processor(text=[prompt], images=[_image(40, 30, seed=0)])
    input_ids = mx.array(inputs["input_ids"])
    placeholders = int((input_ids == _image_token_id(model)).sum())
    assert placeholders > 0
    assert image_features(model, inputs).shape == (
        placeholders,
        model.config.text_config.hidden_size,
    )

    # Feed the processed tensors (mlx-vlm's own image= path passes padding kwargs that
    # transformers 5's CLIP image processor rejects for llava).
    extra = {
        k: mx.array(v)
        for k, v in inputs.items()
        if k not in ("input_ids", "pixel_values", "attention_mask")
    }

    def greedy() -> list[int]:
        return [
            r.token
            for r in mlx_vlm.stream_generate(
                model,
                processor,
                prompt,
                input_ids=input_ids,
                pixel_values=mx.array(inputs["pixel_values"]),
                mask=mx.array(inputs["attention_mask"]),
                max_tokens=5,
                temperature=0.0,
                **extra,
            )
        ]

    first = greedy()
    assert len(first) >= 5, family
    assert greedy() == first


def test_features_of_two_images_are_each_images_features_concatenated(loaded):
    _, model, processor = loaded
    a, b = _image(40, 30, seed=1), _image(50, 70, seed=2)
    one = _prompt(processor, ONE_IMAGE)
    alone = mx.concatenate(
        [
            image_features(model, processor(text=[one], images=[a])),
            image_features(model, processor(text=[one], images=[b])),
        ]
    )
    both = processor(text=[_prompt(processor, TWO_IMAGES)], images=[a, b])
    together = image_features(model, both)
    assert int((mx.array(both["input_ids"]) == _image_token_id(model)).sum()) == together.shape[0]
    assert together.shape == alone.shape
    assert mx.allclose(together, alone, atol=1e-5).item()

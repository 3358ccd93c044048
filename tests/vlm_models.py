"""Tiny random-weight vision-language model folders that the test suite builds itself.

Seeded, random-weight (N(0, 0.02); embeddings and LM head wider so greedy logits are
peaked and varied; the Qwen-VL language models' attention projections wider too, so their
greedy text depends on M-RoPE positions), a few layers each, a byte-level BPE tokenizer with the family's
special tokens first (ids 0, 1, 2, ... in the order listed in each builder), a chat
template (also written as chat_template.jinja) that takes a string content or an
OpenAI-style list of ``{"type": "text"}`` / ``{"type": "image"}`` parts and writes the
family's image placeholder, and the processor files mlx-vlm 0.7.10 reads. Weights are
written from the mlx-vlm ``Model``'s own parameter tree (``{"format": "mlx"}``); the
families' ``sanitize`` passes those names unchanged (qwen2_vl's 5-D patch conv is
stored in PyTorch layout because its sanitize always transposes it back).
``build_vlm(family, out)`` writes a folder; ``mlx_vlm.utils.load(out)`` loads it
offline. ``image_features(model, processor_output)`` returns the projected vision rows
(one per placeholder token, in prompt order) for any family here.

Facts per family, at these sizes (checked on CPU with mlx 0.32.4 / mlx-vlm 0.7.10 /
transformers 5.25; "concat" means: features of two images in one prompt equal the
concatenation of each image's features computed alone; it held exactly, max
difference 0.0, for every family):

- ``llava`` (LLaVA 1.5: CLIP 56 px / patch 14, 2 layers, width 32 + llama 64 x 2):
  placeholder ``<image>`` = id 3 (``image_token_index``); the processor repeats it to
  16 tokens per image, whatever its size (resized and centre-cropped to 56 px; 4x4
  patches, CLS dropped by the "default" strategy). The LM takes ``inputs_embeds``
  (``model.language_model(ids, inputs_embeds=..., mask=..., cache=...)``, plain
  positions). Features: ``*_, hs = model.vision_tower(pixel_values.transpose(0, 2, 3,
  1), output_hidden_states=True)``; ``model.multi_modal_projector(hs[-2][:, 1:])`` ->
  ``(n_images, 16, 64)``; ``get_input_embeddings(ids, pixel_values,
  cached_image_features=<that 3-D array>)`` scatters them (batch of one). Concat: yes.
  Note: ``mlx_vlm.generate(..., image=...)`` fails for llava here (LlavaProcessor
  forwards ``padding`` to transformers 5's CLIP image processor, which rejects it);
  calling the processor yourself and passing ``input_ids=/pixel_values=/mask=`` works.
- ``gemma3`` (SigLIP 64 px / patch 8 + gemma3_text 64 x 4 layers, ``sliding_window``
  32, ``sliding_window_pattern`` 2: layers 0 and 2 slide (RotatingKVCache 32), 1 and 3
  are global): the template writes ``<start_of_image>`` (boi, id 6), which the
  processor expands to ``\\n\\n<start_of_image>`` + 16 x ``<image_soft_token>`` (id 8,
  ``image_token_index``) + ``<end_of_image>`` (eoi, id 7) ``\\n\\n``: 16 image tokens
  per image, any size (resized to 64 px, 8x8 patches average-pooled to 4x4). The LM
  takes ``inputs_embeds`` but multiplies them by sqrt(hidden) (get_input_embeddings
  divides the image rows by sqrt(config.hidden_size) first, text rows are raw
  ``embed_tokens``); lm_head is always tied to the embeddings (its sanitize copies
  them). get_input_embeddings also returns ``attention_mask_4d`` (outer product of the
  padding mask, not causal), which ``Model.__call__`` passes as the LM's mask.
  Features: ``hs, _, _ = model.vision_tower(pixel_values.transpose(0, 2, 3, 1),
  output_hidden_states=True)``; ``model.multi_modal_projector(hs)`` -> ``(n_images,
  16, 64)``; same ``cached_image_features=`` (3-D). Concat: yes.
- ``idefics3`` (SmolVLM: SigLIP-style 32 px tiles / patch 8, pixel shuffle x2, + llama
  64 x 2): placeholder ``<image>`` = id 4 (``image_token_id``); the processor expands
  each to ``<fake_token_around_image><row_r_col_c>`` + 4 x ``<image>`` per tile, then
  ``<fake_token_around_image><global-img>`` + 4 x ``<image>``. Images are resized to
  longest edge 64 and cut into 32 px tiles: 2x2 tiles + global = 20 tokens for 40x30
  (and for most shapes), 1x2 + global = 12 for strongly elongated ones (64x16, 500x100).
  ``pixel_values`` is ``(batch, tiles, 3, 32, 32)`` with ``pixel_attention_mask``;
  all-zero padding tiles are dropped. The LM takes ``inputs_embeds`` (plain positions).
  Features: ``pooled, *_ = model.vision_model(tiles NHWC, patch_attention_mask=...,
  output_hidden_states=True)``; ``model.connector(pooled)`` -> ``(tiles, 4, 64)``,
  reshaped to 2-D ``(rows, 64)``, which is also the shape ``cached_image_features=``
  takes. Concat: yes.
- ``qwen2_vl`` (Qwen2-VL vision 32 wide x 2 blocks, patch 14, merge 2 + qwen2 64 x 2,
  M-RoPE ``mrope_section`` [2, 3, 3]): the template writes
  ``<|vision_start|><|image_pad|><|vision_end|>`` (ids 3, 5, 4; ``image_token_id`` 5,
  ``video_token_id`` 6); the processor repeats ``<|image_pad|>`` t*h*w/4 times from
  ``image_grid_thw`` (smart resize to multiples of 28 px, min_pixels 112x112, max
  224x224): 20 tokens for 40x30 (grid 1x8x10), 16 for tiny or 64x16 images, 49 for
  200x200, at most 64. ``pixel_values`` is ``(patches, 1176)`` for all images
  concatenated. The LM takes ``inputs_embeds`` plus M-RoPE ``position_ids`` (3, B, L)
  from ``model.language_model.get_rope_index(ids, image_grid_thw, None, mask)`` (which
  also gives ``rope_deltas`` for decode positions; the language model keeps
  ``_rope_deltas`` / ``_position_ids`` as state on itself). Features:
  ``model.vision_tower(pixel_values, image_grid_thw, output_hidden_states=False)`` ->
  2-D ``(rows, 64)`` (images kept apart by cu_seqlens in its attention); the same 2-D
  array goes to ``cached_image_features=``. Concat: yes.
- ``qwen2_5_vl`` (Qwen2.5-VL: the same tokenizer, template, processor files and language
  model as ``qwen2_vl``; its vision tower 32 wide x 2 blocks, windowed attention over
  2x2 merged-patch windows in block 0 and full attention in block 1, an MLP merger to
  64): the same token counts, grids, ``get_rope_index`` and feature shapes as
  ``qwen2_vl``. Concat: yes.
"""

from __future__ import annotations

import json
from pathlib import Path

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? Paris is the capital of France.",
    "What is this? This is a picture of a red square on a blue background.",
    "def add(a, b):\n    return a + b\n",
    "USER: ASSISTANT: user assistant model system 0123456789",
]


def content_loop(image: str) -> str:
    """Jinja that writes a message's content: a plain string, or an OpenAI-style list
    of text and image parts (an image part becomes ``image``)."""
    return (
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}"
        "{% if part['type'] == 'text' %}{{ part['text'] }}"
        "{% elif part['type'] in ('image', 'image_url') %}" + image + "{% endif %}"
        "{% endfor %}{% endif %}"
    )


def _build_tokenizer(
    out: Path,
    special_tokens: list[str],
    chat_template: str,
    *,
    eos: str,
    pad: str,
    bos: str | None = None,
    extra: dict | None = None,
    vocab_size: int = 384,
) -> dict[str, int]:
    """A byte-level BPE tokenizer (as tests/tiny_model.py's) with the family's special
    tokens first, so their ids are 0, 1, 2, ... in ``special_tokens`` order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "unk_token": pad,
        "chat_template": chat_template,
        "add_bos_token": False,
        "model_max_length": 4096,
        **(extra or {}),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "chat_template.jinja").write_text(chat_template)
    return {t: tok.token_to_id(t) for t in special_tokens} | {"__size__": tok.get_vocab_size()}


def _save_weights(
    out: Path, model, seed: int, scales: dict[str, float], scale: float = 0.02
) -> None:
    """Replace every parameter by seeded N(0, scale) noise (norms and biases stay as
    built; a name ending in a key of ``scales`` gets that scale, so logits are peaked
    and varied) and save them as an mlx folder's weights."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten

    rng = np.random.default_rng(seed)
    params = {}
    for name, value in tree_flatten(model.parameters()):
        if "norm" in name or "layernorm" in name or name.endswith(".bias"):
            params[name] = value
            continue
        s = next((v for k, v in scales.items() if name.endswith(k)), scale)
        params[name] = mx.array(rng.normal(0.0, s, size=value.shape).astype(np.float32))
        if value.ndim == 5:
            # Conv3d: mlx-vlm's sanitize always transposes 5-D patch weights from
            # PyTorch's (out, in, t, h, w), so store them that way.
            params[name] = params[name].transpose(0, 4, 1, 2, 3)
    mx.save_safetensors(str(out / "model.safetensors"), params, metadata={"format": "mlx"})


def _write_model(
    out: Path, family_module, config: dict, seed: int, scales: dict[str, float]
) -> None:
    from mlx_vlm.utils import update_module_configs

    model_config = family_module.ModelConfig.from_dict(config)
    model_config = update_module_configs(
        model_config, family_module, config, ["text", "vision", "perceiver", "projector", "audio"]
    )
    model = family_module.Model(model_config)
    _save_weights(out, model, seed, scales)
    (out / "config.json").write_text(json.dumps(config, indent=2))


# --- llava -------------------------------------------------------------------------

LLAVA_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: {% elif message['role'] == 'assistant' %}ASSISTANT: {% endif %}"
    + content_loop("<image>\n")
    + "{% if message['role'] == 'assistant' %}</s>{% else %} {% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def _build_llava(out: Path, seed: int) -> None:
    from mlx_vlm.models import llava

    ids = _build_tokenizer(
        out,
        ["<unk>", "<s>", "</s>", "<image>", "<pad>"],
        LLAVA_TEMPLATE,
        eos="</s>",
        pad="<pad>",
        bos="<s>",
    )
    image_size, patch = 56, 14
    config = {
        "model_type": "llava",
        "architectures": ["LlavaForConditionalGeneration"],
        "image_token_index": ids["<image>"],
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -2,
        "vocab_size": ids["__size__"],
        "eos_token_id": ids["</s>"],
        "text_config": {
            "model_type": "llama",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5,
            "vocab_size": ids["__size__"],
            "rope_theta": 10000.0,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,
        },
        "vision_config": llava_vision_config(image_size, patch),
    }
    _write_model(out, llava, config, seed, {"embed_tokens.weight": 1.0, "lm_head.weight": 1.0})
    write_llava_processor(out, image_size, patch)


def llava_vision_config(image_size: int, patch: int) -> dict:
    """The tiny CLIP tower of the llava builders (this one and ``tests/scripted_vlm.py``)."""
    return {
        "model_type": "clip_vision_model",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "image_size": image_size,
        "patch_size": patch,
        "projection_dim": 32,
        "num_channels": 3,
        "layer_norm_eps": 1e-5,
    }


def write_llava_processor(out: Path, image_size: int, patch: int) -> None:
    """LLaVA 1.5's processor files: CLIP resize and centre crop, ``<image>`` repeated."""
    (out / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "CLIPImageProcessor",
                "do_resize": True,
                "size": {"shortest_edge": image_size},
                "do_center_crop": True,
                "crop_size": {"height": image_size, "width": image_size},
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": [0.48145466, 0.4578275, 0.40821073],
                "image_std": [0.26862954, 0.26130258, 0.27577711],
                "do_convert_rgb": True,
                "resample": 3,
            },
            indent=2,
        )
    )
    (out / "processor_config.json").write_text(
        json.dumps(
            {
                "processor_class": "LlavaProcessor",
                "patch_size": patch,
                "vision_feature_select_strategy": "default",
                "image_token": "<image>",
                "num_additional_image_tokens": 1,
            },
            indent=2,
        )
    )


# --- gemma3 ------------------------------------------------------------------------

GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    + content_loop("<start_of_image>")
    + "{{ '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


def _build_gemma3(
    out: Path,
    seed: int,
    *,
    text: dict | None = None,
    vision: dict | None = None,
    image_size: int = 64,
    patch: int = 8,
    mm_tokens: int = 16,
    scales: dict[str, float] | None = None,
) -> None:
    """The tiny gemma3 above; ``text`` / ``vision`` override its configs' keys, the
    image geometry can grow and ``scales`` override weight scales by name suffix
    (``bench/vision_model.py`` builds a bench-sized one)."""
    from mlx_vlm.models import gemma3

    specials = [
        "<pad>",
        "<eos>",
        "<bos>",
        "<unk>",
        "<start_of_turn>",
        "<end_of_turn>",
        "<start_of_image>",
        "<end_of_image>",
        "<image_soft_token>",
    ]
    ids = _build_tokenizer(
        out,
        specials,
        GEMMA3_TEMPLATE,
        eos="<end_of_turn>",
        pad="<pad>",
        bos="<bos>",
        extra={
            "extra_special_tokens": {
                "image_token": "<image_soft_token>",
                "boi_token": "<start_of_image>",
                "eoi_token": "<end_of_image>",
            }
        },
    )
    config = {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "image_token_index": ids["<image_soft_token>"],
        "boi_token_index": ids["<start_of_image>"],
        "eoi_token_index": ids["<end_of_image>"],
        "mm_tokens_per_image": mm_tokens,
        "hidden_size": (text or {}).get("hidden_size", 64),
        "pad_token_id": ids["<pad>"],
        "vocab_size": ids["__size__"],
        "eos_token_id": [ids["<eos>"], ids["<end_of_turn>"]],
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 64,
            "num_hidden_layers": 4,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "head_dim": 16,
            "num_key_value_heads": 2,
            "query_pre_attn_scalar": 16,
            "sliding_window": 32,
            "sliding_window_pattern": 2,
            "mm_tokens_per_image": mm_tokens,
            "vocab_size": ids["__size__"],
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096,
            **(text or {}),
        },
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "intermediate_size": 64,
            "num_attention_heads": 4,
            "image_size": image_size,
            "patch_size": patch,
            "num_channels": 3,
            "layer_norm_eps": 1e-6,
            **(vision or {}),
        },
    }
    _write_model(out, gemma3, config, seed, {"embed_tokens.weight": 0.3, **(scales or {})})
    (out / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Gemma3ImageProcessor",
                "processor_class": "Gemma3Processor",
                "do_resize": True,
                "size": {"height": image_size, "width": image_size},
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "do_convert_rgb": True,
                "do_pan_and_scan": False,
                "resample": 2,
            },
            indent=2,
        )
    )
    (out / "processor_config.json").write_text(
        json.dumps({"processor_class": "Gemma3Processor", "image_seq_length": mm_tokens}, indent=2)
    )


# --- idefics3 ----------------------------------------------------------------------

IDEFICS3_TEMPLATE = (
    "<|im_start|>"
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}{% if message['content'] is string or message['content'][0]['type'] != 'image' %}: {% else %}:{% endif %}"
    + content_loop("<image>")
    + "<end_of_utterance>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def _build_idefics3(out: Path, seed: int) -> None:
    from mlx_vlm.models import idefics3

    grid = [f"<row_{r}_col_{c}>" for r in range(1, 5) for c in range(1, 5)]
    specials = [
        "<|endoftext|>",
        "<|im_start|>",
        "<end_of_utterance>",
        "<fake_token_around_image>",
        "<image>",
        "<global-img>",
        *grid,
    ]
    ids = _build_tokenizer(
        out,
        specials,
        IDEFICS3_TEMPLATE,
        eos="<end_of_utterance>",
        pad="<|endoftext|>",
        bos="<|im_start|>",
    )
    tile, patch, scale_factor, longest_edge = 32, 8, 2, 64
    image_seq_len = (tile // patch) ** 2 // scale_factor**2
    config = {
        "model_type": "idefics3",
        "architectures": ["Idefics3ForConditionalGeneration"],
        "image_token_id": ids["<image>"],
        "scale_factor": scale_factor,
        "vocab_size": ids["__size__"],
        "eos_token_id": ids["<end_of_utterance>"],
        "pad_token_id": ids["<|endoftext|>"],
        "text_config": {
            "model_type": "llama",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5,
            "vocab_size": ids["__size__"],
            "rope_theta": 10000.0,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "model_type": "idefics3_vision",
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "intermediate_size": 64,
            "num_attention_heads": 4,
            "image_size": tile,
            "patch_size": patch,
            "num_channels": 3,
            "layer_norm_eps": 1e-6,
        },
    }
    _write_model(out, idefics3, config, seed, {"embed_tokens.weight": 1.0, "lm_head.weight": 1.0})
    (out / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Idefics3ImageProcessor",
                "processor_class": "Idefics3Processor",
                "do_convert_rgb": True,
                "do_resize": True,
                "size": {"longest_edge": longest_edge},
                "max_image_size": {"longest_edge": tile},
                "do_image_splitting": True,
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "do_pad": True,
                "resample": 1,
            },
            indent=2,
        )
    )
    (out / "processor_config.json").write_text(
        json.dumps(
            {"processor_class": "Idefics3Processor", "image_seq_len": image_seq_len}, indent=2
        )
    )


# --- qwen2_vl ----------------------------------------------------------------------

QWEN2_VL_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    + content_loop("<|vision_start|><|image_pad|><|vision_end|>")
    + "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


QWEN_ATTENTION_SCALE = 0.3


def _build_qwen2_vl(out: Path, seed: int, family: str = "qwen2_vl") -> None:
    """The tiny Qwen2-VL above, or (``family="qwen2_5_vl"``) its Qwen2.5-VL sibling: the
    same tokenizer, template, language model and processor files, and Qwen2.5-VL's vision
    tower (windowed attention over 4x4-patch windows, full attention in its last block,
    an MLP merger to ``out_hidden_size``)."""
    from mlx_vlm.models import qwen2_5_vl, qwen2_vl

    specials = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|image_pad|>",
        "<|video_pad|>",
    ]
    ids = _build_tokenizer(out, specials, QWEN2_VL_TEMPLATE, eos="<|im_end|>", pad="<|endoftext|>")
    patch, merge = 14, 2
    vision = {
        "model_type": family,
        "depth": 2,
        "embed_dim": 32,
        "hidden_size": 64,
        "num_heads": 4,
        "mlp_ratio": 2,
        "patch_size": patch,
        "spatial_patch_size": patch,
        "spatial_merge_size": merge,
        "temporal_patch_size": 2,
        "in_channels": 3,
    }
    if family == "qwen2_5_vl":
        vision = {
            **vision,
            "hidden_size": 32,
            "intermediate_size": 64,
            "out_hidden_size": 64,
            "window_size": patch * merge * 2,
            "fullatt_block_indexes": [1],
        }
    config = {
        "model_type": family,
        "architectures": [
            "Qwen2_5_VLForConditionalGeneration"
            if family == "qwen2_5_vl"
            else "Qwen2VLForConditionalGeneration"
        ],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "eos_token_id": ids["<|im_end|>"],
        "vocab_size": ids["__size__"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "tie_word_embeddings": False,
        "vision_config": vision,
    }
    module = qwen2_5_vl if family == "qwen2_5_vl" else qwen2_vl
    # Sharp attention that outweighs a token's own embedding (wide attention projections):
    # where a token sits changes what it reads, so greedy text tells wrong M-RoPE positions
    # from right ones (at 0.02 the model is nearly a bigram model, blind to positions).
    scales = {"embed_tokens.weight": 1.0, "lm_head.weight": 1.0}
    scales |= {f"self_attn.{p}_proj.weight": QWEN_ATTENTION_SCALE for p in "qkvo"}
    _write_model(out, module, dict(config), seed, scales)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    image = {
        "patch_size": patch,
        "temporal_patch_size": 2,
        "merge_size": merge,
        "min_pixels": 112 * 112,
        "max_pixels": 224 * 224,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
    }
    processor = "Qwen2_5_VLProcessor" if family == "qwen2_5_vl" else "Qwen2VLProcessor"
    (out / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Qwen2VLImageProcessor",
                "processor_class": processor,
                **image,
            },
            indent=2,
        )
    )
    (out / "video_preprocessor_config.json").write_text(json.dumps(image, indent=2))
    (out / "processor_config.json").write_text(json.dumps({"processor_class": processor}, indent=2))


def _build_qwen2_5_vl(out: Path, seed: int) -> None:
    _build_qwen2_vl(out, seed, family="qwen2_5_vl")


_BUILDERS = {
    "llava": _build_llava,
    "gemma3": _build_gemma3,
    "idefics3": _build_idefics3,
    "qwen2_vl": _build_qwen2_vl,
    "qwen2_5_vl": _build_qwen2_5_vl,
}
VLM_FAMILIES = tuple(_BUILDERS)


def image_features(model, inputs):
    """The projected vision features (rows in language-model space, one per image
    placeholder token, in prompt order) that ``model`` computes for the images in a
    processor output ``inputs``: a 2-D ``(rows, text hidden)`` array, the same values
    ``get_input_embeddings`` scatters into the placeholder positions (it accepts them
    back as ``cached_image_features=``, in the family's own shape, see the module doc)."""
    import mlx.core as mx

    kind = model.config.model_type
    pixel_values = mx.array(inputs["pixel_values"])
    if kind == "llava":
        *_, hidden = model.vision_tower(
            pixel_values.transpose(0, 2, 3, 1), output_hidden_states=True
        )
        feats = model.multi_modal_projector(hidden[model.vision_feature_layer][:, 1:])
    elif kind == "gemma3":
        hidden, _, _ = model.vision_tower(
            pixel_values.transpose(0, 2, 3, 1), output_hidden_states=True
        )
        feats = model.multi_modal_projector(hidden)
    elif kind == "idefics3":
        b, n, c, h, w = pixel_values.shape
        tiles = pixel_values.reshape(b * n, c, h, w)
        real = [i for i in range(b * n) if bool(mx.any(tiles[i] != 0.0))]
        tiles = tiles[mx.array(real)]
        patch = model.config.vision_config.patch_size
        patch_mask = mx.ones((len(real), h // patch, w // patch), dtype=mx.bool_)
        if inputs.get("pixel_attention_mask") is not None:
            pam = mx.array(inputs["pixel_attention_mask"]).reshape(b * n, h, w)[mx.array(real)]
            pam = pam[:, : h // patch * patch, : w // patch * patch]
            pam = pam.reshape(len(real), h // patch, patch, w // patch, patch).transpose(
                0, 1, 3, 2, 4
            )
            patch_mask = pam.sum(axis=(-1, -2)) > 0
        pooled, *_ = model.vision_model(
            tiles.transpose(0, 2, 3, 1), patch_attention_mask=patch_mask, output_hidden_states=True
        )
        feats = model.connector(pooled.astype(tiles.dtype))
    elif kind in ("qwen2_vl", "qwen2_5_vl"):
        feats = model.vision_tower(
            pixel_values, mx.array(inputs["image_grid_thw"]), output_hidden_states=False
        )
    else:
        raise ValueError(f"no image_features for {kind!r}")
    return feats.reshape(-1, feats.shape[-1])


def build_vlm(family: str, out: Path, seed: int = 0, **sizes) -> Path:
    """Write a tiny seeded ``family`` model folder into ``out`` that
    ``mlx_vlm.utils.load(out)`` loads offline; returns ``out``. ``sizes`` go to the
    family's builder (gemma3 only: ``text``, ``vision``, ``image_size``, ``patch``,
    ``mm_tokens``, ``scales``)."""
    if family not in _BUILDERS:
        raise ValueError(f"unknown VLM family {family!r}; known: {VLM_FAMILIES}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _BUILDERS[family](out, seed, **sizes)
    return out

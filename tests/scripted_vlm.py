"""A tiny LLaVA whose greedy output is scripted: it asks Claude Code to Read a picture,
then answers once the picture has come back in a tool result.

The language model is ``tests/agent_model``'s (a BPE trained on this repository's text so
a 20k-token agent prompt fits, 64 wide, attention and MLP outputs zero: the next token
depends only on the last), inside an mlx-vlm LLaVA 1.5 folder with the tiny CLIP tower
and processor of ``tests/vlm_models``. The chat template ends its generation prompt with
a cue token that picks the script:

- ``<|call|>`` while no tool has answered yet and tools are offered: one ``Read`` call of
  the PNG path given at build time (the call's JSON is one added token);
- ``<|answer|>`` when a tool has answered since the last assistant turn: ``ANSWER``;
- ``<|chat|>`` otherwise (a follow-up question, a side request without tools): ``REPLY``.

An earlier answer is rendered with the cue it was generated after, so each request's
prompt starts with the previous prompt and the previous answer. Image parts, in user and
tool messages alike, are written as ``<image>``, which the processor repeats 16 times;
the rows written over those positions reach no later position (attention outputs are
zero), so a picture never changes the script.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from tests.agent_model import train_agent_bpe
from tests.vlm_models import content_loop, llava_vision_config, write_llava_processor

ANSWER = "The screenshot shows a test pattern."
REPLY = "Nothing more to add."
EOS = "<|im_end|>"
IMAGE = "<image>"
CUES = ["<|call|>", "<|answer|>", "<|chat|>"]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", EOS, IMAGE, *CUES]
MARKERS = ["<tool_call>", "</tool_call>"]
CONTEXT = 65536
IMAGE_SIZE, PATCH = 56, 14  # 16 image tokens per picture, whatever its size

CHAT_TEMPLATE = (
    # answered: some tool has answered; pending: one answered since the last assistant turn
    # (Claude Code may add text after a tool result, in the same user turn).
    "{%- set ns = namespace(answered=false, pending=false) %}"
    "{%- for message in messages %}{% if message.role == 'tool' %}"
    "{% set ns.answered = true %}{% endif %}{% endfor %}"
    "{%- if tools %}<|im_start|>system\nTools you can call:\n"
    "{% for tool in tools %}{{ tool.function | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if message.tool_calls %}<|call|>{% elif ns.pending %}<|answer|>{% else %}<|chat|>{% endif %}"
    "{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}"
    '<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}</tool_call>'
    "{% endfor %}<|im_end|>\n{% set ns.pending = false %}"
    "{% else %}<|im_start|>{{ message.role }}\n" + content_loop(IMAGE) + "<|im_end|>\n"
    "{% if message.role == 'tool' %}{% set ns.pending = true %}{% endif %}"
    "{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if ns.pending %}<|answer|>{% elif tools and not ns.answered %}<|call|>{% else %}<|chat|>{% endif %}"
    "{% endif %}"
)


def read_call(png: Path) -> str:
    """The one tool call this model makes: Claude Code's Read of ``png`` (an absolute path)."""
    return json.dumps({"name": "Read", "arguments": {"file_path": str(png)}})


def _scripts(png: Path) -> list[list[str]]:
    return [
        ["<|call|>", "<tool_call>", read_call(png), "</tool_call>", EOS],
        ["<|answer|>", ANSWER, EOS],
        ["<|chat|>", REPLY, EOS],
    ]


def _build_tokenizer(out: Path, png: Path, vocab_size: int) -> dict[str, int]:
    tok = train_agent_bpe(vocab_size, SPECIAL_TOKENS, [*MARKERS, read_call(png), ANSWER, REPLY])
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE,
        "add_bos_token": False,
        "model_max_length": CONTEXT,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return tok.get_vocab(with_added_tokens=True)


def build_scripted_vlm(out: Path, png: Path, vocab_size: int = 4096) -> Path:
    """Write the scripted LLaVA folder into ``out``; its tool call reads ``png``."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models import llava
    from mlx_vlm.utils import update_module_configs

    out.mkdir(parents=True, exist_ok=True)
    vocab = _build_tokenizer(out, png, vocab_size)
    size = max(vocab.values()) + 1
    hidden = 64
    config = {
        "model_type": "llava",
        "architectures": ["LlavaForConditionalGeneration"],
        "image_token_index": vocab[IMAGE],
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -2,
        "vocab_size": size,
        "eos_token_id": vocab[EOS],
        "text_config": {
            "model_type": "llama",
            "hidden_size": hidden,
            "num_hidden_layers": 1,
            "intermediate_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "rms_norm_eps": 1e-5,
            "vocab_size": size,
            "rope_theta": 10000.0,
            "max_position_embeddings": CONTEXT,
            "tie_word_embeddings": False,
        },
        "vision_config": llava_vision_config(IMAGE_SIZE, PATCH),
    }
    mx.random.seed(0)
    model_config = update_module_configs(
        llava.ModelConfig.from_dict(config), llava, config, ["text", "vision", "projector"]
    )
    params = dict(tree_flatten(llava.Model(model_config).parameters()))
    lm = "language_model."
    for name in params:
        if name.startswith(lm) and name.endswith(("o_proj.weight", "down_proj.weight")):
            params[name] = mx.zeros_like(params[name])
    params[lm + "model.embed_tokens.weight"], params[lm + "lm_head.weight"] = _script_weights(
        vocab, size, hidden, _scripts(png)
    )
    mx.save_safetensors(str(out / "model.safetensors"), params, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    write_llava_processor(out, IMAGE_SIZE, PATCH)
    return out


def _script_weights(vocab: dict[str, int], size: int, hidden: int, scripts: list[list[str]]):
    """Embeddings and LM head: every ordinary token is followed by the end of turn, each
    script token (its own embedding direction) by the next one of its script."""
    import mlx.core as mx

    steps = [pair for script in scripts for pair in itertools.pairwise(script)]
    assert len(steps) < hidden
    embed = [[0.0] * hidden for _ in range(size)]
    for row in embed:
        row[0] = 1.0  # dimension 0: shared by every token
    head = [[0.0] * hidden for _ in range(size)]
    head[vocab[EOS]][0] = 3.0  # after any ordinary token: end the turn
    for j, (a, b) in enumerate(steps):
        embed[vocab[a]][1 + j] = 1.0
        head[vocab[b]][1 + j] = 6.0  # beats the end of turn wherever token a is last
    return mx.array(embed), mx.array(head)

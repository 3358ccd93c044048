"""A tiny model whose greedy output is scripted: tool calls and thinking on cue.

Every layer's output projection is zero, so the residual stream is the last
token's embedding; embeddings are one-hot and ``lm_head`` maps token ``i`` to
``NEXT[i]`` with a large margin. The next token depends only on the last one,
and the chat template ends its generation prompt with a cue token that picks
the script: a tool call when tools are offered, an answer after a tool result,
thinking then text otherwise. ``<|loop|>`` repeats itself until ``max_tokens``.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

MODEL_ID = "scripted"
TOOL_JSON = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ANSWER = "It is sunny in Paris."
THOUGHT = "Let me think."
REPLY = "Hello there."
EOS = "<|im_end|>"
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    EOS,
    "<|call|>",
    "<|answer|>",
    "<|chat|>",
    "<|loop|>",
]
# Added like Qwen's: ordinary (non-special) tokens, so decoding keeps them.
MARKERS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
WORDS = [TOOL_JSON, ANSWER, THOUGHT, REPLY]
SCRIPTS = [
    ["<|call|>", "<tool_call>", TOOL_JSON, "</tool_call>", EOS],
    ["<|answer|>", ANSWER, EOS],
    ["<|chat|>", "<think>", THOUGHT, "</think>", REPLY, EOS],
    ["<|loop|>", "<|loop|>"],
]

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou can call: "
    "{% for tool in tools %}{{ tool.function.name }} {% endfor %}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{% if tool_call.function %}{% set tool_call = tool_call.function %}{% endif %}"
    '<tool_call>{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if messages[-1].role == 'tool' %}<|answer|>{% elif tools %}<|call|>{% else %}<|chat|>{% endif %}"
    "{% endif %}"
)


def _build_tokenizer(out: Path) -> dict[str, int]:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=280,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(
        ["What is the weather in Paris? user assistant system tool"] * 4, trainer
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKERS + WORDS])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": EOS,
                "pad_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
                "chat_template": CHAT_TEMPLATE,
                "tool_parser_type": "json_tools",
                "add_bos_token": False,
                "model_max_length": 32768,
            }
        )
    )
    return tok.get_vocab(with_added_tokens=True)


def build_scripted_model(out: Path) -> Path:
    """Write the scripted mlx-lm llama folder into ``out`` (named ``scripted``)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    out.mkdir(parents=True, exist_ok=True)
    vocab = _build_tokenizer(out)
    size = len(vocab)
    hidden = -(-size // 64) * 64  # one-hot embeddings need hidden >= vocab
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": 1,
        "intermediate_size": 64,
        "num_attention_heads": hidden // 64,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5,
        "vocab_size": size,
        "rope_theta": 10000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    }
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    for name in params:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            params[name] = mx.zeros_like(params[name])
    params["model.embed_tokens.weight"] = mx.eye(size, hidden)
    nxt = {i: vocab[EOS] for i in range(size)}
    for script in SCRIPTS:
        for a, b in itertools.pairwise(script):
            nxt[vocab[a]] = vocab[b]
    head = [[0.0] * hidden for _ in range(size)]
    for i, j in nxt.items():
        head[j][i] = 30.0
    params["lm_head.weight"] = mx.array(head)
    mx.save_safetensors(str(out / "model.safetensors"), params, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out

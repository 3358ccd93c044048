"""A tiny model for driving real agent CLIs: a long context, a template that renders tools,
and an answer that ends after a few tokens.

Agents send 15-25k-token prompts (a system prompt, tool definitions as JSON schemas, an
environment block) and treat a reply cut by ``max_tokens`` as an error; a random model
never stops. Here the next token depends only on the last one, as in ``scripted_model``,
but the embeddings are compact: every ordinary token shares one embedding (whose next
token is the end of turn), and each script token has a direction of its own, so the
vocabulary can be large (a BPE trained on this repository's text, so long English and
JSON prompts stay within the context) while the model stays 64 wide. Its attention and
MLP outputs are zero: its KV cache is real, its answers are scripted.

Every turn answers ``<think>Let me think.</think>Hello there.``; the template renders an
earlier answer exactly so (the cue token, then the reasoning, then the text), so a
follow-up turn's prompt starts with the previous prompt plus the previous answer.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

MODEL_ID = "agent"
THOUGHT = "Let me think."
REPLY = "Hello there."
EOS = "<|im_end|>"
CUE = "<|chat|>"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", EOS, CUE]
MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
WORDS = [THOUGHT, REPLY]
SCRIPT = [CUE, "<think>", THOUGHT, "</think>", REPLY, EOS]
CONTEXT = 65536

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools you can call:\n"
    "{% for tool in tools %}{{ tool.function | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}<|im_start|>assistant\n" + CUE + ""
    "{% if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% endif %}"
    "{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}"
    '<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n" + CUE + "{% endif %}"
)


def _corpus() -> list[str]:
    """This repository's own prose and code: what agent prompts look like (English, JSON)."""
    root = Path(__file__).resolve().parents[1]
    paths = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    paths += sorted((root / "src").rglob("*.py")) + sorted((root / "tests").rglob("*.py"))
    return [p.read_text(encoding="utf-8", errors="replace") for p in paths if p.is_file()]


def train_agent_bpe(vocab_size: int, special: list[str], added: list[str]):
    """A byte-level BPE trained on this repository's text, ``special`` tokens first (ids 0,
    1, ...), then ``added`` as ordinary tokens (as Qwen's markers: decoding keeps them)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return tok


def _build_tokenizer(out: Path, vocab_size: int) -> dict[str, int]:
    tok = train_agent_bpe(vocab_size, SPECIAL_TOKENS, MARKERS + WORDS)
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
                "model_max_length": CONTEXT,
            }
        )
    )
    return tok.get_vocab(with_added_tokens=True)


def build_agent_model(out: Path, vocab_size: int = 4096) -> Path:
    """Write the agent test model (an mlx-lm llama folder) into ``out``."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    out.mkdir(parents=True, exist_ok=True)
    vocab = _build_tokenizer(out, vocab_size)
    size = max(vocab.values()) + 1
    hidden = 64
    config = {
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
    }
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    for name in params:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            params[name] = mx.zeros_like(params[name])
    # Dimension 0: shared by every token; dimension 1 + j: script token j alone.
    script = [vocab[t] for t in SCRIPT[:-1]]
    assert len(script) < hidden
    embed = [[0.0] * hidden for _ in range(size)]
    for i in range(size):
        embed[i][0] = 1.0
    for j, token in enumerate(script):
        embed[token][1 + j] = 1.0
    head = [[0.0] * hidden for _ in range(size)]
    head[vocab[EOS]][0] = 3.0  # any ordinary token: end the turn
    for j, (a, b) in enumerate(itertools.pairwise(SCRIPT)):
        assert vocab[a] == script[j]
        head[vocab[b]][1 + j] = 6.0  # beats the end of turn wherever token a is last
    params["model.embed_tokens.weight"] = mx.array(embed)
    params["lm_head.weight"] = mx.array(head)
    mx.save_safetensors(str(out / "model.safetensors"), params, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out

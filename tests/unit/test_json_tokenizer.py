"""omlx's ``tokenizer.json`` tokenizer against transformers' on the same folders.

The prompt text a chat template renders and the ids it encodes to decide the model's input
and every cache key, so ``JsonTokenizer`` must give what transformers gives, exactly: on
the default model's real vocabulary and template (rebuilt from its GGUF), the test models'
tokenizers, and a template written here that uses what real templates use (tools,
``tojson``, reasoning, loop controls, ``raise_exception``, ``{% generation %}``, named
templates).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from omlx.adapters.mlx.models.json_tokenizer import JsonTokenizer
from omlx.adapters.mlx.models.tokenizer_loader import load_tokenizer, why_not_json
from tests.agent_model import _build_tokenizer as build_agent_tokenizer
from tests.tiny_model import build_tokenizer as build_tiny_tokenizer

transformers = pytest.importorskip("transformers")

# A template of our own in the style of current tool-calling templates.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{%- for tool in tools %}\n"
    "{{ tool | tojson }}{%- endfor %}\n"
    "{%- if messages[0].role == 'system' %}\n{{ messages[0].content }}{%- endif %}<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}"
    "<|im_end|>\n{%- endif %}\n"
    "{%- for message in messages %}\n"
    "{%- if message.role == 'system' %}{% continue %}{% endif %}\n"
    "{%- if message.role not in ['user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role ' ~ message.role) }}{% endif %}\n"
    "<|im_start|>{{ message.role }}\n"
    "{%- if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>"
    "{%- endif %}\n"
    "{%- if message.content is string %}{{ message.content }}"
    "{%- elif message.content %}{%- for part in message.content %}{{ part.text }}"
    "{%- endfor %}{%- endif %}\n"
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}\n"
    "<tool_call>{{ {'name': call.function.name, 'arguments': call.function.arguments}"
    " | tojson(indent=2) }}</tool_call>{%- endfor %}{%- endif %}\n"
    "{% generation %}{{ '' }}{% endgeneration %}"
    "<|im_end|>\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    "{{ bos_token if false else '' }}"
)

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Be brief. Réponds en français ✓"},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Bonjour", "reasoning_content": "greet back"},
        {"role": "user", "content": [{"type": "text", "text": "and 2+2?"}]},
    ],
    [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "ls", "arguments": {"p": "."}},
                }
            ],
        },
        {"role": "tool", "content": "a.py\nb.py", "tool_call_id": "c1"},
    ],
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "ls",
            "description": "List files — héllo",
            "parameters": {"type": "object", "properties": {"p": {"type": "string"}}},
        },
    }
]
TEXTS = [
    "",
    "Hello world",
    " leading space",
    "  two  spaces\n\ttab",
    "naïve café ✓ 日本語 🙂",
    "x = 1234567 + 89",
    "Don't stop . , ! ?",
]


def _with_template(folder: Path, template: object) -> Path:
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    out = {}
    # The default model's real vocabulary and template, as omlx rebuilds them from the GGUF.
    smollm = root / "smollm2"
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from omlx.adapters.mlx.models.gguf import read_gguf, default_model_path;"
            "from omlx.adapters.mlx.models.gguf_tokenizer import write_tokenizer_files;"
            "write_tokenizer_files(read_gguf(default_model_path(), dequantize=False).metadata,"
            " sys.argv[1])",
            str(smollm),
        ],
        check=True,
    )
    out["smollm2"] = smollm
    tiny = root / "tiny"
    tiny.mkdir()
    build_tiny_tokenizer(tiny)
    out["tiny"] = tiny
    agent = root / "agent"
    agent.mkdir()
    build_agent_tokenizer(agent, 1024)
    out["agent"] = agent
    tools = root / "tools"
    tools.mkdir()
    build_agent_tokenizer(tools, 1024)
    out["tools"] = _with_template(tools, TOOLS_TEMPLATE)
    # The same vocabulary under the other tokenizer classes read from tokenizer.json alone.
    for cls in ("GPT2TokenizerFast", "Qwen2Tokenizer", "CodeGenTokenizerFast", "TokenizersBackend"):
        folder = root / cls
        shutil.copytree(smollm, folder)
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config["tokenizer_class"] = cls
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        out[cls] = folder
    named = root / "named"
    named.mkdir()
    build_agent_tokenizer(named, 1024)
    out["named"] = _with_template(
        named,
        [
            {"name": "default", "template": "{% for m in messages %}[{{ m.content }}]{% endfor %}"},
            {"name": "tool_use", "template": TOOLS_TEMPLATE},
        ],
    )
    return out


CLASSES = ["GPT2TokenizerFast", "Qwen2Tokenizer", "CodeGenTokenizerFast", "TokenizersBackend"]


@pytest.mark.parametrize("name", ["smollm2", "tiny", "agent", "tools", "named", *CLASSES])
def test_encode_decode_vocab_and_special_tokens_equal_transformers(folders, name):
    folder = folders[name]
    assert (
        why_not_json(folder, json.loads((folder / "tokenizer_config.json").read_text()), {}) == ""
    )
    ours = JsonTokenizer.from_folder(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    assert ours.get_vocab() == theirs.get_vocab()
    assert len(ours) == len(theirs) and ours.vocab_size == theirs.vocab_size
    assert ours.eos_token_id == theirs.eos_token_id and ours.bos_token_id == theirs.bos_token_id
    assert ours.special_tokens_map == theirs.special_tokens_map
    for text in TEXTS:
        for special in (True, False):
            ids = theirs.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == ids, (text, special)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                    ids, skip_special_tokens=skip
                )
    ids = list(range(min(len(theirs), 300)))
    assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("name", ["smollm2", "tiny", "agent", "tools", "named"])
def test_chat_templates_render_what_transformers_renders(folders, name):
    ours = JsonTokenizer.from_folder(folders[name])
    theirs = transformers.AutoTokenizer.from_pretrained(folders[name])
    for messages in CONVERSATIONS:
        for tools in (None, TOOLS):
            for prompt in (True, False):
                kwargs = {"tools": tools, "add_generation_prompt": prompt, "tokenize": False}
                try:
                    expected = theirs.apply_chat_template(messages, **kwargs)
                except Exception as exc:  # a template that refuses: ours refuses too
                    with pytest.raises(type(exc)):
                        ours.apply_chat_template(messages, **kwargs)
                    continue
                assert ours.apply_chat_template(messages, **kwargs) == expected, (messages, tools)
                tokens = ours.apply_chat_template(
                    messages, tools=tools, add_generation_prompt=prompt
                )
                assert tokens == theirs.encode(expected, add_special_tokens=False)
    last = [*CONVERSATIONS[1][:3]]
    assert ours.apply_chat_template(
        last, tokenize=False, continue_final_message=True
    ) == theirs.apply_chat_template(last, tokenize=False, continue_final_message=True)


def test_a_template_s_raise_exception_reaches_the_caller(folders):
    ours = JsonTokenizer.from_folder(folders["tools"])
    with pytest.raises(Exception, match="unknown role robot"):
        ours.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


def test_the_wrapped_tokenizer_streams_and_stops_as_mlx_lm_s_own(folders):
    """Same detokenizer class, eos ids and thinking markers as mlx-lm's loader gives."""
    from mlx_lm.tokenizer_utils import load as mlx_lm_load

    for name in ("smollm2", "agent"):
        ours = load_tokenizer(folders[name])
        theirs = mlx_lm_load(folders[name])
        assert type(ours._tokenizer).__name__ == "JsonTokenizer"
        assert type(ours.detokenizer).__name__ == type(theirs.detokenizer).__name__
        assert ours.eos_token_ids == theirs.eos_token_ids
        assert ours.think_start == theirs.think_start
        assert ours.has_chat_template == theirs.has_chat_template
        text = "Réponse: 42 ✓\nnext line"
        detok = ours.detokenizer
        detok.reset()
        for token in ours.encode(text, add_special_tokens=False):
            detok.add_token(token)
        detok.finalize()
        assert detok.text == text


def test_a_tokenizer_transformers_must_build_goes_through_transformers(folders, tmp_path):
    folder = tmp_path / "llama-style"
    folder.mkdir()
    build_tiny_tokenizer(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "LlamaTokenizerFast"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert why_not_json(folder, config, {}) == "tokenizer class LlamaTokenizerFast"
    assert type(load_tokenizer(folder)._tokenizer).__name__ != "JsonTokenizer"


def test_serving_a_tokenizer_json_model_never_imports_transformers(tmp_path):
    """A fresh interpreter: import the server, load a tokenizer.json model and its engine
    modules, render and encode a prompt; transformers stays out of ``sys.modules``."""
    from tests.tiny_model import build_tiny_model

    folder = build_tiny_model(tmp_path / "tiny")
    code = (
        "import sys\n"
        "import omlx.app.server, omlx.app.api.app, omlx.app.wiring.bootstrap\n"
        "from omlx.adapters.mlx.models.loader import load_model\n"
        "import omlx.adapters.mlx.batch.engine\n"
        f"m = load_model({str(folder)!r})\n"
        "t = m.tokenizer\n"
        "text = t.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False,"
        " add_generation_prompt=True)\n"
        "assert t.encode(text, add_special_tokens=False)\n"
        "print('transformers' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_transformers_arrives_when_a_tokenizer_needs_it_and_mlx_lm_keeps_its_classes(tmp_path):
    """In a fresh interpreter: mlx-lm imported without transformers, then a tokenizer only
    transformers builds; mlx-lm's classes keep their identity, its loader gets the real one."""
    folder = tmp_path / "llama-style"
    folder.mkdir()
    build_tiny_tokenizer(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "LlamaTokenizerFast"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    code = (
        "import sys, omlx.adapters.mlx\n"
        "import mlx_lm.tokenizer_utils as tu\n"
        "from omlx.adapters.mlx.mlx_lm_private import light_import\n"
        "assert 'transformers' not in sys.modules and light_import.imported_without_transformers()\n"
        "wrapper, bpe = tu.TokenizerWrapper, tu.BPEStreamingDetokenizer\n"
        "from omlx.adapters.mlx.models.tokenizer_loader import load_tokenizer\n"
        f"t = load_tokenizer({str(folder)!r})\n"
        "import transformers\n"
        "assert tu.AutoTokenizer is transformers.AutoTokenizer\n"
        "assert issubclass(tu.NewlineTokenizer, transformers.PreTrainedTokenizerFast)\n"
        "assert tu.TokenizerWrapper is wrapper and tu.BPEStreamingDetokenizer is bpe\n"
        "assert isinstance(t, wrapper) and isinstance(t.detokenizer, bpe)\n"
        "assert type(t._tokenizer).__name__ != 'JsonTokenizer'\n"
        "print(t.decode(t.encode('hello world', add_special_tokens=False)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip().splitlines()[-1] == "hello world"

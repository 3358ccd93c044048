"""Chat templates of the strict families, written for the tests from how the real ones behave.

- ``MISTRAL``: as Mistral Small 3.1's (and Devstral's, fine-tuned from it): the system prompt
  only first (a default one otherwise), user and plain assistant turns alternating (tool
  calls and results do not count), a system message anywhere else raises; calls as
  ``[TOOL_CALLS][{..., "id"}]`` with ids of at least nine characters, results as
  ``[TOOL_RESULTS]{"content", "call_id"}``; no generation prompt. (3.1's own puts
  ``[AVAILABLE_TOOLS]`` before the last user message, which moves it every time a user
  writes: that rewrite is the template's own, so here they follow the system prompt, as in
  Mistral's later templates.)
- ``GEMMA3``: no system role (the leading system text opens the first user turn), turns
  strictly alternating user/model, any other role raising there, contents trimmed, no tools.
- ``GEMMA2``: as Gemma 3, but a system message raises.
- ``SYSTEM_FIRST``: ChatML that raises on a system message anywhere but first, as Qwen's and
  Llama's do (the rule alone, without alternation).

``template_folder`` writes one into a tokenizer folder, its markers special tokens as in the
real tokenizers.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_model import CHAT_TEMPLATE, build_tokenizer

MISTRAL = (
    "{{- bos_token -}}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system = messages[0].content -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system = 'You are a helpful assistant.' -%}{%- set rest = messages -%}"
    "{%- endif -%}"
    "[SYSTEM_PROMPT]{{ system }}[/SYSTEM_PROMPT]"
    "{%- if tools -%}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif -%}"
    "{%- set turn = namespace(n=0) -%}"
    "{%- for m in rest -%}"
    "{%- if m.role == 'user' or (m.role == 'assistant' and not m.tool_calls) -%}"
    "{%- if (m.role == 'user') != (turn.n % 2 == 0) -%}"
    "{{ raise_exception('After the optional system message, conversation roles must "
    "alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set turn.n = turn.n + 1 -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in rest -%}"
    "{%- if m.role == 'user' -%}[INST]{{ m.content }}[/INST]"
    "{%- elif m.role == 'assistant' and m.tool_calls -%}[TOOL_CALLS]["
    "{%- for call in m.tool_calls -%}"
    "{%- if call.id | length < 9 -%}"
    "{{ raise_exception('Tool call ids must be at least nine characters long') }}"
    "{%- endif -%}"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}, '
    '"id": "{{ call.id[-9:] }}"}{{ ", " if not loop.last }}'
    "{%- endfor -%}]{{ eos_token }}"
    "{%- elif m.role == 'assistant' -%}{{ m.content }}{{ eos_token }}"
    "{%- elif m.role == 'tool' -%}"
    '[TOOL_RESULTS]{"content": {{ m.content | tojson }}, "call_id": "{{ m.tool_call_id[-9:] }}"}'
    "[/TOOL_RESULTS]"
    "{%- else -%}"
    "{{ raise_exception('Only user, assistant and tool roles are supported, with the "
    "exception of an initial optional system message!') }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

_GEMMA_TURNS = (
    "{%- for m in rest -%}"
    "{%- if (m.role == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
    "{{ prefix if loop.first }}{{ m.content | trim }}<end_of_turn>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<start_of_turn>model\n{%- endif -%}"
)
GEMMA3 = (
    "{{- bos_token -}}"
    "{%- if messages[0].role == 'system' -%}"
    "{%- set prefix = messages[0].content | trim + '\n\n' -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}"
    "{%- set prefix = '' -%}{%- set rest = messages -%}"
    "{%- endif -%}" + _GEMMA_TURNS
)
GEMMA2 = (
    "{{- bos_token -}}"
    "{%- if messages[0].role == 'system' -%}"
    "{{ raise_exception('System role not supported') }}"
    "{%- endif -%}"
    "{%- set prefix = '' -%}{%- set rest = messages -%}" + _GEMMA_TURNS
)

SYSTEM_FIRST = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' and not loop.first -%}"
    "{{ raise_exception('System message must be at the beginning.') }}"
    "{%- endif -%}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)

# family: (template, special tokens its prompts hold, bos, eos)
FAMILIES: dict[str, tuple[str, list[str], str | None, str]] = {
    "chatml": (CHAT_TEMPLATE, [], None, "<|im_end|>"),
    "system-first": (SYSTEM_FIRST, [], None, "<|im_end|>"),
    "mistral": (
        MISTRAL,
        [
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_CALLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ],
        "<s>",
        "</s>",
    ),
    "gemma3": (GEMMA3, ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"], "<bos>", "<eos>"),
    "gemma2": (GEMMA2, ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"], "<bos>", "<eos>"),
}


def template_folder(out: Path, family: str) -> Path:
    """A tokenizer folder (tests/tiny_model.py's tokenizer) with ``family``'s template."""
    from tokenizers import Tokenizer

    template, markers, bos, eos = FAMILIES[family]
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    if markers:
        tok = Tokenizer.from_file(str(out / "tokenizer.json"))
        tok.add_special_tokens(markers)
        tok.save(str(out / "tokenizer.json"))
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.update(chat_template=template, bos_token=bos, eos_token=eos)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out

"""A model folder's tokenizer as mlx-lm's ``TokenizerWrapper``: from ``tokenizer.json`` where
it can (``JsonTokenizer``: no ``transformers`` import, ~1 s less at start), else through
mlx-lm's own loader and ``transformers``. The log says which, and why.

The wrapper is built as mlx-lm's ``tokenizer_utils.load`` builds it: the streaming
detokenizer its ``tokenizer.json`` decoder calls for, the tool parser its chat template or
vocabulary names, its end-of-sequence ids.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omlx.adapters.mlx.mlx_lm_private.light_import import import_mlx_lm, real_transformers
from omlx.adapters.mlx.mlx_lm_private.tokenizers import (
    detokenizer_class,
    tokenizer_defaults,
    tool_parser_name,
)
from omlx.adapters.mlx.models.json_tokenizer import JsonTokenizer, read_json

log = logging.getLogger(__name__)

# Tokenizer classes whose transformers implementation is the ``tokenizer.json`` as it is:
# no post-processor rebuilt from config flags, no text rewritten before or after (each is
# held to transformers in tests/unit/test_json_tokenizer.py).
PLAIN_CLASSES = frozenset(
    {
        "",
        "PreTrainedTokenizerFast",
        "TokenizersBackend",
        "GPT2Tokenizer",
        "GPT2TokenizerFast",
        "Qwen2Tokenizer",
        "Qwen2TokenizerFast",
        "CodeGenTokenizer",
        "CodeGenTokenizerFast",
    }
)


def why_not_json(folder: Path, config: Mapping[str, Any], extra: Mapping[str, Any]) -> str:
    """Why this folder's tokenizer needs transformers; "" when ``tokenizer.json`` serves."""
    if not (folder / "tokenizer.json").exists():
        return "no tokenizer.json"
    if extra:
        return f"tokenizer settings given ({', '.join(sorted(extra))})"
    name = str(config.get("tokenizer_class") or "")
    if name not in PLAIN_CLASSES:
        return f"tokenizer class {name}"
    if config.get("auto_map") or config.get("chat_template_type"):
        return "custom tokenizer code or template type"
    if config.get("add_bos_token") or config.get("add_eos_token"):
        return "add_bos_token/add_eos_token set (transformers rebuilds the post-processor)"
    if "add_prefix_space" in config:
        return "add_prefix_space set (transformers rebuilds the pre-tokenizer)"
    return ""


def load_tokenizer(
    folder: Path | str,
    eos_token_ids: Any = None,
    defaults: Mapping[str, Any] | None = None,
    tokenizer_config_extra: Mapping[str, Any] | None = None,
) -> Any:
    """The folder's tokenizer in mlx-lm's wrapper (see the module's docstring)."""
    folder = Path(folder)
    import_mlx_lm()
    config = read_json(folder / "tokenizer_config.json")
    reason = why_not_json(folder, config, tokenizer_config_extra or {})
    if reason:
        log.info("tokenizer of %s: through transformers (%s)", folder.name, reason)
        real_transformers()
        from mlx_lm.tokenizer_utils import load

        return load(
            folder,
            dict(tokenizer_config_extra or {}),
            eos_token_ids=eos_token_ids,
            defaults=dict(defaults if defaults is not None else tokenizer_defaults(folder) or {}),
        )
    log.debug("tokenizer of %s: tokenizer.json (tokenizers, no transformers)", folder.name)
    if defaults is None:
        defaults = tokenizer_defaults(folder)
    return wrap(JsonTokenizer.from_folder(folder), eos_token_ids, defaults)


def wrap(
    tokenizer: JsonTokenizer,
    eos_token_ids: Any = None,
    defaults: Mapping[str, Any] | None = None,
) -> Any:
    """``tokenizer`` in mlx-lm's wrapper, with the detokenizer and tool parser mlx-lm's
    loader would pick for it."""
    import_mlx_lm()
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    decoder = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder")
    defaults = dict(defaults or {})
    if eos_token_ids is None:
        eos_token_ids = defaults.get("eos_token_ids")
    if isinstance(eos_token_ids, int):
        eos_token_ids = [eos_token_ids]
    parser_name = tokenizer.init_kwargs.get("tool_parser_type", defaults.get("tool_parser_type"))
    if parser_name is None:
        parser_name = tool_parser_name(tokenizer)
    parser = start = end = None
    if parser_name is not None:
        module = importlib.import_module(f"mlx_lm.tool_parsers.{parser_name}")
        parser, start, end = module.parse_tool_call, module.tool_call_start, module.tool_call_end
        tokenizer.init_kwargs["tool_parser_type"] = parser_name
    wrapper = TokenizerWrapper(
        tokenizer,
        detokenizer_class(decoder),
        eos_token_ids=eos_token_ids,
        tool_parser=parser,
        tool_call_start=start,
        tool_call_end=end,
    )
    # mlx-lm counts any tokenizer class with its own renderer as having a template.
    wrapper.has_chat_template = tokenizer.chat_template is not None
    return wrapper

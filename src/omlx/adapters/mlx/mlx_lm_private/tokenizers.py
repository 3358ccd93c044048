"""mlx-lm's private choices for a tokenizer, for omlx's own tokenizer loader: which
streaming detokenizer a ``tokenizer.json`` decoder calls for (``_is_spm_decoder``,
``_is_spm_decoder_no_space``, ``_is_bpe_decoder``), which tool parser a chat template or
vocabulary names (``_infer_tool_parser``), and a model class's tokenizer defaults
(``mlx_lm.utils._tokenizer_defaults``). Asked here so both loaders choose alike."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from omlx.adapters.mlx.mlx_lm_private.light_import import import_mlx_lm


def detokenizer_class(decoder: Any) -> Any:
    """The streaming detokenizer mlx-lm's loader picks for ``tokenizer.json``'s decoder."""
    import_mlx_lm()
    from mlx_lm import tokenizer_utils as tu

    if decoder is None:
        return tu.NaiveStreamingDetokenizer
    if tu._is_spm_decoder(decoder):
        return tu.SPMStreamingDetokenizer
    if tu._is_spm_decoder_no_space(decoder):
        return partial(tu.SPMStreamingDetokenizer, trim_space=False)
    if tu._is_bpe_decoder(decoder):
        return tu.BPEStreamingDetokenizer
    return tu.NaiveStreamingDetokenizer


def tool_parser_name(tokenizer: Any) -> str | None:
    """The tool parser mlx-lm infers from a tokenizer's chat template or vocabulary."""
    import_mlx_lm()
    from mlx_lm import tokenizer_utils as tu

    return tu._infer_tool_parser(tokenizer)


def tokenizer_defaults(folder: Path) -> dict[str, Any] | None:
    """The model class's tokenizer defaults (``TOKENIZER_DEFAULTS``), as mlx-lm's loader reads them."""
    import_mlx_lm()
    from mlx_lm import utils

    return utils._tokenizer_defaults(folder)

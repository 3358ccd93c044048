"""What an engine is asked to run with (``EngineConfig``), and what it runs with, decided once
at its start (``Features``): speculation, exact KV, the fused final chunk and in-order decode
each need mlx-lm's private state, so the version check is asked here, and what it turns off
is logged here, one line per feature."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from omlx.adapters.mlx.batch.fused_prefill import FusingBatchGenerator
from omlx.adapters.mlx.batch.prompt_lookup import PromptLookup
from omlx.adapters.mlx.batch.speculation import Proposer, Speculation
from omlx.adapters.mlx.cache.exact import exact_fits, exact_prompt_cache
from omlx.adapters.mlx.mlx_lm_private import version
from omlx.adapters.mlx.models.loader import LoadedModel
from omlx.domain.cache.kv_quant import KVQuant
from omlx.domain.speculation import SpeculationConfig

log = logging.getLogger("omlx.adapters.mlx.batch.engine")  # the engine's own lines


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_concurrent: int = 8
    prefill_step_size: int = 256
    # Bytes of KV for the running requests plus the hot tier; None: no memory guard.
    kv_memory_limit: int | None = None
    # Run a tiny generation on the engine thread before the first request (see _warm_up).
    warm_up: bool = True
    # Run a short final prefill chunk with the prompt's last token (``fused_prefill``):
    # one forward pass less per request; used on plain attention layouts only.
    fuse_last_token: bool = True
    # Idle this long, the engine hands MLX's freed buffers back to the system; sooner, an
    # agent's next turn reuses them instead of faulting fresh pages in.
    release_buffers_after_s: float = 60.0
    # Speculative decoding (``speculative.py``); None: off. Plain attention layouts only.
    speculation: SpeculationConfig | None = None
    # Evaluate each decode step before building the next (None: on the CPU only, where
    # mlx-lm's pipelined steps hand tokens out a pass late). Tests set False to run the
    # pipelined steps here.
    in_order: bool | None = None
    # Exact KV mode (``kv_mode``): the running cache of full-attention layers holds
    # ``exact_kv``'s codes (``quantized_batch_cache``), so a restored block equals what the
    # miss computed. None: full precision.
    exact_kv: KVQuant | None = None


@dataclass(frozen=True, slots=True)
class Features:
    """What an engine runs with. ``private``: it may use mlx-lm's private state (blocks cut
    from a running request's cache uncopied, omlx's own batch classes); every other
    feature here is on only where ``private`` is."""

    private: bool
    fuse: bool
    in_order: bool
    speculation: Speculation | None
    exact_kv: KVQuant | None  # the model's head_dims are checked on the engine thread


def features_for(
    model: LoadedModel, config: EngineConfig, proposer: Proposer | None, caching: bool
) -> Features:
    """Decide once, at the engine's start, what it runs with; log what is turned off."""
    plain = plain_layout(model)
    in_order = config.in_order
    if in_order is None:
        # On the CPU, mlx-lm's pipelined decode step hands tokens out a pass late.
        in_order = mx.default_device().type == mx.cpu
    spec = config.speculation if plain else None
    if config.speculation is not None and not plain:
        log.info(
            "speculative decoding of %s: off: its cache has layers a refused draft cannot be "
            "taken back from (recurrent state or a sliding window)",
            model.model_id,
        )
    fuse = config.fuse_last_token and plain
    wanted: list[tuple[str, str]] = []  # (feature, what runs instead) if it is turned off
    if spec is not None:
        wanted.append(("speculative decoding", "each step decodes one token"))
    if config.exact_kv is not None:
        wanted.append(("exact KV", "its cache runs and is stored in full precision"))
    if fuse:
        wanted.append(("the fused final chunk", "a prompt's last token runs as a pass of its own"))
    if in_order:
        wanted.append(("in-order decode", "mlx-lm's pipelined steps hand tokens out a pass late"))
    wanted.append(
        ("the copy-free move to decoding", "a row's cache is copied to decode and when it ends")
    )
    if caching:
        wanted.append(("uncopied block cuts", "blocks are cut through extract_cache, a copy"))
        wanted.append(("the copy-free merge", "a restored prefix is copied into the batch"))
    private = version.at_engine_start(model.model_id, wanted)
    speculation = None
    if spec is not None and private:
        if proposer is None:
            proposer = PromptLookup(spec.ngram_max, spec.ngram_min)
        speculation = Speculation(spec, proposer)
    return Features(
        private,
        fuse and private,
        in_order and private,
        speculation,
        config.exact_kv if private else None,
    )


def plain_layout(model: LoadedModel) -> bool:
    """Whether the model's cache is plain attention only (no windows, no recurrent state)."""
    layout = model.layout
    return layout is not None and not layout.unsupported and layout.domain.plain


def exact_caches(model: LoadedModel, quant: KVQuant | None) -> Callable[[], list[Any]] | None:
    """What makes a fresh request's cache in exact mode; None where it does not apply.

    Runs the model (one token): call it on the engine thread.
    """
    if quant is None:
        return None
    if not exact_fits(model.model, quant.group_size):
        log.warning(
            "exact KV of %s: off: a head_dim is not a multiple of kv_group_size %d; its cache "
            "runs and is stored in full precision",
            model.model_id,
            quant.group_size,
        )
        return None
    log.info("exact KV of %s: the running cache holds %s codes", model.model_id, quant.label)
    return partial(exact_prompt_cache, model.model, quant.group_size, quant.bits)


def new_generator(
    model: LoadedModel, config: EngineConfig, features: Features, runs: Any = None
) -> BatchGenerator:
    """The batcher: omlx's (``FusingBatchGenerator``) where it may use mlx-lm's private
    state, mlx-lm's own elsewhere. ``runs``: what it calls instead of the model (an
    M-RoPE model's ``row_plans.PlannedRows``); None: the model."""
    runs = model.model if runs is None else runs
    options = dict(
        completion_batch_size=config.max_concurrent,
        # Every admitted prompt joins the prefill batch at once: a short prompt
        # beside a long one is split off to decode after its own last chunk.
        prefill_batch_size=config.max_concurrent,
        prefill_step_size=config.prefill_step_size,
    )
    if not features.private:
        return BatchGenerator(runs, **options)
    return FusingBatchGenerator(
        runs,
        fuse=features.fuse,
        in_order=features.in_order,
        speculation=features.speculation,
        **options,
    )

"""Embedding and rerank models against the numbers computed directly from mlx-lm's forward pass."""

from __future__ import annotations

import asyncio
import base64
import math
import struct

import mlx.core as mx
import pytest
from mlx_lm.utils import load as mlx_lm_load

from omlx.adapters.mlx.models.encoders import load_embedding_model, load_rerank_model
from omlx.adapters.mlx.models.runner import MLXRunner
from omlx.app.errors import InvalidRequest
from omlx.app.models.catalog import EMBEDDING, RERANK, catalog
from omlx.app.models.encoding import EmbeddingService, RerankService
from tests.encoder_models import (
    NO,
    RERANK_OMLX_JSON,
    YES,
    build_embedding_model,
    build_rerank_model,
)

TEXTS = ["What is the capital of France?", "def add(a, b): return a + b", "Paris"]


@pytest.fixture(scope="module")
def runner():
    r = MLXRunner("test").start()
    yield r
    r.stop()


def direct_embeddings(path, pooling: str, normalize: bool) -> list[list[float]]:
    model, tokenizer = mlx_lm_load(str(path))
    out = []
    for text in TEXTS:
        hidden = model.model(mx.array([tokenizer.encode(text)]))[0]
        v = {"last": hidden[-1], "mean": hidden.mean(axis=0)}[pooling]
        if normalize:
            v = v / mx.linalg.norm(v)
        out.append(v.tolist())
    return out


@pytest.mark.parametrize(
    ("pooling", "mode", "normalize"),
    [("last", "pooling_mode_lasttoken", True), ("mean", "pooling_mode_mean_tokens", False)],
)
def test_embeddings_equal_a_direct_forward_pass_and_pooling(
    tmp_path, runner, pooling, mode, normalize
):
    folder = build_embedding_model(tmp_path / "emb", mode, normalize)
    assert catalog([str(folder)])[0].task == EMBEDDING
    model = load_embedding_model(folder, "emb")
    assert (model.pooling, model.normalize, model.dimensions) == (pooling, normalize, 64)
    service = EmbeddingService(runner, model)
    got = asyncio.run(service.embed(TEXTS)).vectors
    want = direct_embeddings(folder, pooling, normalize)
    assert len(got) == 3  # one per input, in order
    for g, w in zip(got, want, strict=True):
        assert max(abs(a - b) for a, b in zip(g, w, strict=True)) < 1e-5
    if normalize:
        assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-5 for v in got)


def test_dimensions_base64_and_token_inputs(tmp_path, runner):
    model = load_embedding_model(build_embedding_model(tmp_path / "emb"), "emb")
    service = EmbeddingService(runner, model)
    full = asyncio.run(service.embed("Paris")).vectors[0]
    short = asyncio.run(service.embed("Paris", dimensions=16)).vectors[0]
    norm = math.sqrt(sum(x * x for x in full[:16]))
    assert len(short) == 16 and all(
        abs(a - b / norm) < 1e-6 for a, b in zip(short, full[:16], strict=True)
    )
    packed = asyncio.run(service.embed(["Paris"], encoding="base64")).vectors[0]
    assert list(struct.unpack("<64f", base64.b64decode(packed))) == pytest.approx(full, abs=1e-7)
    tokens = model.tokenizer.encode("Paris")
    assert asyncio.run(service.embed(tokens)).vectors[0] == pytest.approx(full, abs=1e-6)
    assert len(asyncio.run(service.embed([tokens, tokens])).vectors) == 2
    for bad, param in ((["x", ""], "input"), ([], "input"), ([[10**6]], "input")):
        with pytest.raises(InvalidRequest) as err:
            asyncio.run(service.embed(bad))
        assert err.value.param == param
    with pytest.raises(InvalidRequest, match="dimensions"):
        asyncio.run(service.embed("x", dimensions=65))


def test_rerank_scores_are_the_yes_no_logits_computed_directly(tmp_path, runner):
    folder = build_rerank_model(tmp_path / "rr")
    assert catalog([str(folder)])[0].task == RERANK
    model = load_rerank_model(folder, "rr")
    documents = ["Paris is the capital of France.", "The quick brown fox.", "def add(a, b)"]
    ranked, tokens = asyncio.run(RerankService(runner, model).rank("capital of France?", documents))
    raw, tokenizer = mlx_lm_load(str(folder))
    yes, no = (
        tokenizer.encode(YES, add_special_tokens=False)[0],
        tokenizer.encode(NO, add_special_tokens=False)[0],
    )
    want = []
    for document in documents:
        prompt = (
            RERANK_OMLX_JSON["prefix"]
            + RERANK_OMLX_JSON["template"].format(
                query="capital of France?",
                document=document,
                instruction=RERANK_OMLX_JSON["instruction"],
            )
            + RERANK_OMLX_JSON["suffix"]
        )
        logits = raw(mx.array([tokenizer.encode(prompt)]))[0, -1]
        want.append(1 / (1 + math.exp(-(logits[yes] - logits[no]).item())))
    assert [r.index for r in ranked] == sorted(range(3), key=lambda i: -want[i])
    assert [r.score for r in ranked] == pytest.approx(sorted(want, reverse=True), abs=1e-5)
    assert tokens > 0
    top, _ = asyncio.run(
        RerankService(runner, model).rank("capital of France?", documents, top_n=1)
    )
    assert len(top) == 1 and top[0].index == ranked[0].index

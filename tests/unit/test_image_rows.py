"""The image rows' registry: key ids resolve to the right image, clashes are refused."""

from __future__ import annotations

import mlx.core as mx
import pytest

from omlx.adapters.mlx.vision import image_rows as module
from omlx.adapters.mlx.vision.image_rows import ImageRows, ImageRowsMissing
from omlx.domain.cache.image_keys import IMAGE_ID_BASE, image_start


def test_rows_resolve_by_key_id_and_are_encoded_once():
    rows = ImageRows(1 << 20)
    calls = []
    d = "ab" * 32

    def encode():
        calls.append(1)
        return mx.arange(12, dtype=mx.float32).reshape(4, 3)

    rows.register(d, 4, encode)
    got, index = rows.rows_at(image_start(d) + 2)
    assert index == 2 and got.shape == (4, 3)
    rows.rows_at(image_start(d))
    assert len(calls) == 1 and rows.stats()["encoder_passes"] == 1
    with pytest.raises(ImageRowsMissing):
        rows.rows_at(image_start(d) + 4)  # past the image's last token


def test_two_images_whose_key_ids_overlap_are_refused_not_mixed(monkeypatch):
    """Starts are drawn from the digests (2^-30 apart by chance): forced here."""
    starts = {"a" * 64: IMAGE_ID_BASE + 1000, "b" * 64: IMAGE_ID_BASE + 1200}
    starts["c" * 64] = IMAGE_ID_BASE + 1300
    monkeypatch.setattr(module, "image_start", lambda digest, tenant=None: starts[digest])
    rows = ImageRows(1 << 20)
    rows.register("a" * 64, 256, lambda: mx.zeros((256, 2)))
    with pytest.raises(ImageRowsMissing, match="overlapping"):
        rows.register("b" * 64, 16, lambda: mx.ones((16, 2)))  # inside a's ids
    rows.register("c" * 64, 16, lambda: mx.ones((16, 2)))  # after a's last id: kept apart
    a_rows, _ = rows.rows_at(IMAGE_ID_BASE + 1250)
    c_rows, _ = rows.rows_at(IMAGE_ID_BASE + 1300)
    assert float(a_rows.sum()) == 0.0 and float(c_rows.sum()) == 32.0


def test_a_tenants_image_has_key_ids_of_its_own_the_default_ones_unchanged():
    d = "ab" * 32
    assert image_start(d, None) == image_start(d, "") == image_start(d)
    assert len({image_start(d), image_start(d, "acme"), image_start(d, "other")}) == 3
    rows = ImageRows(1 << 20)
    rows.register(d, 2, lambda: mx.zeros((2, 3)))
    rows.register(d, 2, lambda: mx.ones((2, 3)), tenant="acme")
    mine, _ = rows.rows_at(image_start(d, "acme"))
    theirs, _ = rows.rows_at(image_start(d))
    # Each tenant's rows encoded for it: one's are never found for the other.
    assert float(mine.sum()) == 6.0 and float(theirs.sum()) == 0.0
    assert rows.stats()["encoder_passes"] == 2


def test_a_no_store_requests_rows_are_kept_only_for_its_prefill():
    rows = ImageRows(1 << 20)
    d = "cd" * 32
    calls = []

    def encode():
        calls.append(1)
        return mx.ones((4, 2), dtype=mx.bfloat16)

    rows.register(d, 4, encode, store=False)
    rows.rows_at(image_start(d))
    rows.rows_at(image_start(d) + 3)  # the next chunk of its prefill: not encoded again
    assert len(calls) == 1 and rows.tiers.held() == (0, 0)
    rows.register(d, 4, encode, store=None)  # a prompt only counted: leaves it no-store
    rows.rows_at(image_start(d))
    assert rows.tiers.held() == (0, 0)
    rows.register(d, 4, encode, store=True)  # a storing request: the rows in hand are kept
    rows.rows_at(image_start(d) + 1)
    assert len(calls) == 1 and rows.tiers.held() == (1, 16)
    stats = rows.stats()
    assert stats["images"] == 1 and stats["bytes"] == 16 and stats["encoder_passes"] == 1


def test_rows_too_large_for_the_ram_tier_are_encoded_once_per_prefill():
    rows = ImageRows(8)  # a RAM tier smaller than the image's rows
    d = "ef" * 32
    calls = []

    def encode():
        calls.append(1)
        return mx.ones((4, 2))

    rows.register(d, 4, encode, store=True)
    for i in range(4):  # one chunk per token
        rows.rows_at(image_start(d) + i)
    assert len(calls) == 1 and rows.tiers.held() == (0, 0)


def test_an_images_grid_is_told_by_any_of_its_key_ids_without_an_encoder_pass():
    rows = ImageRows(1 << 20)
    d = "cd" * 32
    rows.register(d, 6, lambda: pytest.fail("no rows are needed for a grid"), (1, 2, 3))
    assert rows.image_at(image_start(d) + 5) == (image_start(d), 6, (1, 2, 3))
    rows.register("ef" * 32, 4, lambda: mx.zeros((4, 2)))  # a model without grids
    assert rows.image_at(image_start("ef" * 32))[2] is None
    with pytest.raises(ImageRowsMissing):
        rows.image_at(image_start(d) + 6)

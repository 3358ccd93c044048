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
    monkeypatch.setattr(module, "image_start", starts.__getitem__)
    rows = ImageRows(1 << 20)
    rows.register("a" * 64, 256, lambda: mx.zeros((256, 2)))
    with pytest.raises(ImageRowsMissing, match="overlapping"):
        rows.register("b" * 64, 16, lambda: mx.ones((16, 2)))  # inside a's ids
    rows.register("c" * 64, 16, lambda: mx.ones((16, 2)))  # after a's last id: kept apart
    a_rows, _ = rows.rows_at(IMAGE_ID_BASE + 1250)
    c_rows, _ = rows.rows_at(IMAGE_ID_BASE + 1300)
    assert float(a_rows.sum()) == 0.0 and float(c_rows.sum()) == 32.0


def test_an_images_grid_is_told_by_any_of_its_key_ids_without_an_encoder_pass():
    rows = ImageRows(1 << 20)
    d = "cd" * 32
    rows.register(d, 6, lambda: pytest.fail("no rows are needed for a grid"), (1, 2, 3))
    assert rows.image_at(image_start(d) + 5) == (image_start(d), 6, (1, 2, 3))
    rows.register("ef" * 32, 4, lambda: mx.zeros((4, 2)))  # a model without grids
    assert rows.image_at(image_start("ef" * 32))[2] is None
    with pytest.raises(ImageRowsMissing):
        rows.image_at(image_start(d) + 6)

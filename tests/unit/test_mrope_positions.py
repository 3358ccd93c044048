"""M-RoPE position plans (``vision/mrope.py``): any range of a prompt, whole or in pieces,
gets the positions of a whole-prompt pass; broken key-id runs are refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from omlx.adapters.mlx.vision.mrope import PositionPlan, PositionPlanError, llm_grid
from omlx.domain.cache.image_keys import image_token_ids

A, B = "a" * 64, "b" * 64
GRIDS = {A: (1, 2, 3), B: (1, 2, 2)}  # 6 and 4 tokens; 3 and 2 positions


def image_at(token: int):
    for digest, grid in GRIDS.items():
        ids = image_token_ids(digest, grid[0] * grid[1] * grid[2])
        if token in ids:
            return ids.start, len(ids), grid
    raise KeyError(token)


def prompt() -> list[int]:
    """3 text tokens, image A (2 x 3), 2 text tokens, image B (2 x 2), 4 text tokens."""
    return [
        *(10, 11, 12),
        *image_token_ids(A, 6),
        *(13, 14),
        *image_token_ids(B, 4),
        *(15, 16, 17, 18),
    ]


# Worked by hand as Qwen2-VL's get_rope_index does: text continues one past the largest
# position of the image before it; an image's tokens run over its grid, row-major.
WHOLE = np.array(
    [
        [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 8, 8, 8, 8, 10, 11, 12, 13],
        [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 8, 8, 9, 9, 10, 11, 12, 13],
        [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8, 9, 8, 9, 10, 11, 12, 13],
    ]
)


def test_a_whole_prompt_gets_the_positions_of_a_whole_pass():
    plan = PositionPlan.of(prompt(), image_at)
    assert plan.images == 2
    np.testing.assert_array_equal(plan.positions(0, len(prompt())), WHOLE)


def test_generated_tokens_continue_after_the_last_image():
    plan = PositionPlan.of(prompt(), image_at)
    n = len(prompt())
    np.testing.assert_array_equal(plan.positions(n, 3), np.tile([14, 15, 16], (3, 1)))


def test_a_prompt_without_images_has_plain_positions():
    plan = PositionPlan.of([5, 6, 7, 8], image_at)
    np.testing.assert_array_equal(plan.positions(2, 5), np.tile(np.arange(2, 7), (3, 1)))


@given(st.lists(st.integers(1, 8), min_size=1, max_size=12), st.integers(0, 4))
def test_any_chunking_from_any_restore_point_gives_the_same_positions(sizes, extra):
    plan = PositionPlan.of(prompt(), image_at)
    total = len(prompt()) + extra
    start = min(sizes[0] - 1, total)  # a restore point: inside an image or not
    pieces, at = [], start
    for size in sizes[1:]:
        if at >= total:
            break
        size = min(size, total - at)
        pieces.append(plan.positions(at, size))
        at += size
    pieces.append(plan.positions(at, total - at))
    whole = np.concatenate([WHOLE, np.tile(np.arange(14, 14 + extra), (3, 1))], axis=1)
    np.testing.assert_array_equal(np.concatenate(pieces, axis=1), whole[:, start:])


def test_an_image_cut_short_or_of_a_grid_that_does_not_fit_is_refused():
    tokens = prompt()
    with pytest.raises(PositionPlanError, match="not one whole image"):
        PositionPlan.of(tokens[:6] + tokens[9:], image_at)  # image A's last three dropped
    with pytest.raises(PositionPlanError, match="grid"):
        PositionPlan.of(tokens, lambda t: (*image_at(t)[:2], (1, 1, 1)))
    with pytest.raises(PositionPlanError, match="grid"):
        PositionPlan.of(tokens, lambda t: (*image_at(t)[:2], None))


def test_the_processors_patch_grid_is_merged_into_tokens():
    assert llm_grid([1, 8, 10], 2) == (1, 4, 5)

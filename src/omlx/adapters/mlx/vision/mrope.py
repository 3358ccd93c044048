"""Multimodal RoPE (Qwen2-VL, Qwen2.5-VL) positions as a pure function of a prompt's key tokens.

An M-RoPE model gives each token three positions (time, height, width). A text token's are
all one number, but not its index in the sequence: an image of ``t x h x w`` (merged)
patches takes ``t*h*w`` tokens and only ``max(t, h, w)`` positions, so every token after
it sits that much nearer. mlx-vlm computes this once per prompt (``get_rope_index``) and
keeps the shift as state of the model object, which fits one sequence generated from its
start; omlx runs many rows in one batch, chunked, from wherever a restore left each.

So a request's positions are planned here from what the cache layer knows: the key ids
of the prompt name each image and the index inside it (``domain/cache/image_keys``), and
each image's grid is registered with its rows (``ImageRows``). A grid is a function of the
image's pixels and the processor's files, both already in the block keys and the
namespace: nothing needs storing beside a block, and a restore anywhere (a chunk boundary,
inside an image, after a restart) resumes at the same positions a whole-prompt pass gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from omlx.domain.cache.image_keys import IMAGE_ID_BASE

Grid = tuple[int, int, int]  # an image's (t, h, w) in language-model tokens (after merging)
# What ``ImageRows.image_at`` tells of a key id: the image's first id, token count, grid.
ImageAt = Callable[[int], tuple[int, int, Grid | None]]


class PositionPlanError(ValueError):
    """A prompt's key ids do not make whole images of known grids."""


def llm_grid(patch_grid: Sequence[int], merge: int) -> Grid:
    """The processor's ``image_grid_thw`` row (patches) as language-model tokens."""
    t, h, w = (int(x) for x in patch_grid)
    return t, h // merge, w // merge


@dataclass(frozen=True, slots=True)
class PositionPlan:
    """Where each image of one prompt sits: enough to give any token its three positions.

    ``starts[r]`` is the sequence index of image ``r``'s first token, ``grids[r]`` its
    grid, ``at[r]`` the position of its first token on all three axes, ``after[r]`` what
    a text token after it adds to its sequence index (the same for generated tokens).
    """

    starts: np.ndarray
    grids: np.ndarray  # (images, 3)
    at: np.ndarray
    after: np.ndarray

    @classmethod
    def of(cls, tokens: Sequence[int], image_at: ImageAt) -> PositionPlan:
        ids = np.asarray(tokens, dtype=np.int64)
        keys = np.flatnonzero(ids >= IMAGE_ID_BASE)
        starts, grids, at, after = [], [], [], []
        shift, i = 0, 0
        while i < len(keys):
            start = int(keys[i])
            first, count, grid = image_at(int(ids[start]))
            whole = np.arange(first, first + count)
            if ids[start] != first or not np.array_equal(ids[start : start + count], whole):
                raise PositionPlanError(
                    f"the image tokens at {start} are not one whole image (key id "
                    f"{int(ids[start])}, its image starts at {first} and takes {count})"
                )
            if grid is None or grid[0] * grid[1] * grid[2] != count:
                raise PositionPlanError(
                    f"the image at {start} takes {count} tokens; its grid is {grid}"
                )
            starts.append(start)
            grids.append(grid)
            at.append(start + shift)
            shift += max(grid) - count  # the text after it continues at at + max(grid)
            after.append(shift)
            i += count
        return cls(
            np.array(starts, dtype=np.int64),
            np.array(grids, dtype=np.int64).reshape(-1, 3),
            np.array(at, dtype=np.int64),
            np.array(after, dtype=np.int64),
        )

    @property
    def images(self) -> int:
        return len(self.starts)

    def positions(self, start: int, length: int) -> np.ndarray:
        """The (3, length) positions of sequence indices ``[start, start + length)``.

        Past the prompt (generated tokens) the last image's shift holds.
        """
        index = np.arange(start, start + length, dtype=np.int64)
        out = np.broadcast_to(index, (3, length)).copy()
        if not self.images:
            return out
        image = np.searchsorted(self.starts, index, side="right") - 1
        seen = image >= 0
        r = image[seen]
        out[:, seen] += self.after[r]  # text after image r (image tokens are set below)
        k = index[seen] - self.starts[r]
        t, h, w = self.grids[r].T
        inside = k < t * h * w
        k, r, h, w = k[inside], r[inside], h[inside], w[inside]
        cols = np.flatnonzero(seen)[inside]
        base = self.at[r]
        out[0, cols] = base + k // (h * w)
        out[1, cols] = base + (k // w) % h
        out[2, cols] = base + k % w
        return out

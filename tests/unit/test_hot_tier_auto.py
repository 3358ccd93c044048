"""``hot_cache_max_size = "auto"``: the hot tier sized per model from its KV per token."""

from __future__ import annotations

import pytest

from omlx.app.settings import Settings
from omlx.domain.tier_defaults import (
    HOT_TIER_AUTO_TOKENS,
    HOT_TIER_DEFAULT_BYTES,
    auto_hot_tier_bytes,
)

GB = 10**9


def test_an_8b_model_gets_room_for_an_agent_session_within_half_the_guard() -> None:
    # 8B geometry in float32: 196.6 KB a token; a 24 GB machine's guard is 12 GB.
    per_token = 24 * 8 * 128 * 2 * 4
    assert auto_hot_tier_bytes(per_token, 12 * GB) == 6 * GB  # 31k tokens, not 10.6k
    # With a guard of 64 GB, the whole 131,072 tokens (25.8 GB).
    assert auto_hot_tier_bytes(per_token, 64 * GB) == per_token * HOT_TIER_AUTO_TOKENS


def test_a_small_model_keeps_the_old_floor_unless_the_machine_is_small() -> None:
    per_token = 4_096  # the *long* bench model: 131,072 tokens are 537 MB
    assert auto_hot_tier_bytes(per_token, 12 * GB) == HOT_TIER_DEFAULT_BYTES
    assert auto_hot_tier_bytes(per_token, 2 * GB) == 1 * GB  # half the guard wins
    assert auto_hot_tier_bytes(per_token, None) == HOT_TIER_DEFAULT_BYTES


def test_the_setting_is_auto_by_default_and_a_size_still_works() -> None:
    assert Settings().hot_cache_auto and Settings().hot_cache_bytes is None
    assert Settings(hot_cache_max_size="AUTO").hot_cache_auto
    assert Settings(hot_cache_max_size="8GB").hot_cache_bytes == 8 * GB


def test_a_bad_size_names_auto_as_the_other_choice() -> None:
    with pytest.raises(ValueError, match=r'hot_cache_max_size: bad size .* or "auto"'):
        Settings(hot_cache_max_size="lots").validate()

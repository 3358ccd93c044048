"""An image's encoder output survives a restart (issue 35): a real ``omlx serve`` on a tiny
LLaVA, a real Pillow PNG, the official ``openai`` client and the index read with plain SQL.

After a restart, a prompt whose text before the image changed (so none of the image's KV
blocks can be restored) reads the image's rows back from the SSD tier: no encoder pass,
and the same greedy text as a fresh server that encodes it. A no-store request's image
leaves no row.
"""

from __future__ import annotations

import io
import sqlite3

import pytest

pytest.importorskip(
    "mlx_vlm",
    reason="the vision extra (pip install -e '.[vision]'; scripts/setup-test.sh installs it)",
)

import httpx
import openai
from PIL import Image

from omlx.domain.images import image_digest
from tests.e2e.test_vision import data_url, encoded, serve
from tests.server_process import side_by_side
from tests.storage_checks import assert_cache_invariants
from tests.vlm_models import build_vlm

FIRST_SYSTEM = "You describe screenshots for a developer, briefly. " * 6
CHANGED_SYSTEM = "You review screenshots of a web app and say what is wrong. " * 6


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return build_vlm("llava", tmp_path_factory.mktemp("llava"))


def digest_of(png: bytes) -> str:
    picture = Image.open(io.BytesIO(png)).convert("RGB")
    return image_digest(picture.width, picture.height, picture.tobytes())


def ask(server, model: str, system: str, png: bytes, **extra) -> str:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": system},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url(png, "image/png")}},
                    {"type": "text", "text": "What is this?"},
                ],
            },
        ],
        max_tokens=8,
        temperature=0,
        **extra,
    )
    return r.choices[0].message.content or ""


def images_of(server, model: str) -> dict:
    return httpx.get(server.base_url + "/health", timeout=10).json()["models"][model]["images"]


def test_a_changed_prompt_around_a_seen_image_reads_its_rows_from_ssd_after_a_restart(
    llava, tmp_path
):
    model, cache = llava.name, tmp_path / "cache"
    png, secret = encoded(11), encoded(12)
    with serve(llava, cache, tmp_path / "first.log") as server:
        ask(server, model, FIRST_SYSTEM, png)
        ask(server, model, FIRST_SYSTEM, secret, extra_headers={"x-omlx-cache-control": "no-store"})
        first = images_of(server, model)
    assert first["encoder_passes"] == 2 and first["ssd"] is True and first["queued_for_ssd"] == 1
    assert_cache_invariants(cache)
    with sqlite3.connect(cache / "index.db") as db:
        rows = db.execute(
            "SELECT digest, tenant, row_count, hidden_size, nbytes FROM image_rows"
        ).fetchall()
        usage = db.execute("SELECT image_objects, image_bytes FROM cache_usage").fetchall()
    # The stored image's rows, whose; the no-store request's image left none.
    ((digest, tenant, count, hidden, nbytes),) = rows
    assert (digest, tenant) == (digest_of(png), "") and count > 0 and hidden > 0
    assert usage == [(1, nbytes)]
    assert digest_of(secret) not in {r[0] for r in rows}

    second = serve(llava, cache, tmp_path / "second.log")
    new = serve(llava, tmp_path / "fresh", tmp_path / "fresh.log")
    with side_by_side(second, new):  # the fresh one has a folder of its own
        again = ask(second, model, CHANGED_SYSTEM, png)
        after = images_of(second, model)
        metrics = httpx.get(second.base_url + "/metrics", timeout=10).text
        fresh = ask(new, model, CHANGED_SYSTEM, png)
        assert images_of(new, model)["encoder_passes"] == 1
    # The prefix before the image changed: its KV is recomputed, its rows are read back.
    assert after["encoder_passes"] == 0 and after["ssd_hits"] == 1, after
    assert f'omlx_image_encoder_passes_total{{model="{model}"}} 0.0' in metrics
    assert f'omlx_image_rows_hits_total{{model="{model}",tier="ssd"}} 1.0' in metrics
    assert again == fresh  # rows from disk == rows from the encoder: the same greedy text
    assert_cache_invariants(cache)

"""Two ``omlx serve`` processes on one shared folder and one PostgreSQL index (docs/multi-machine.md).

Real processes, a real PostgreSQL server, the tiny model. B restores what A computed;
both writing one prefix at once leave one row and one file; A killed mid-write leaves
B serving and nothing orphaned after reconcile; a tiny budget holds across both; with
PostgreSQL stopped both keep answering, and they recover when it returns. Each test
ends with the invariant: rows <=> complete files, usage within the budget.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from omlx.adapters.sqlindex import connect_index
from tests.cache_header import checked
from tests.postgres import PostgresServer, find_bindir
from tests.server_process import ServerProcess
from tests.storage_checks import assert_cache_invariants

SYSTEM = "You are an agent working on a shared repository with many tools. " * 12
BAD_SIGNS = ("not served", "Traceback", "corrupt")


def serve(
    name: str, model: Path, cache: Path, url: str, logs: Path, *extra: str, env=None
) -> ServerProcess:
    return ServerProcess(
        "--model",
        str(model),
        "--block-size",
        "16",
        "--index-url",
        url,
        "--server-id",
        name,
        *extra,
        cache_dir=cache,
        log_path=logs / f"{name}.log",
        env=env,
    )


def chat(server: ServerProcess, user: str, system: str = SYSTEM, max_tokens: int = 8):
    client = openai.OpenAI(
        base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120
    )
    return client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        max_tokens=max_tokens,
        temperature=0,
    )


def reported(server: ServerProcess, messages: list[dict[str, str]], session: str):
    """A chat turn sent under a session key, with its ``x-omlx-cache`` header as fields."""
    client = openai.OpenAI(
        base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120
    )
    raw = client.chat.completions.with_raw_response.create(
        model="tiny-llama",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0,
        extra_headers={"X-Session-ID": session},
    )
    return raw.parse(), checked(raw)  # the header, found to say what usage does


def hit_tokens(server: ServerProcess) -> dict[tuple[str, str], float]:
    """``omlx_cache_hit_tokens_total`` by (tier, origin)."""
    return {
        (tier, origin): _metric(
            server,
            f'omlx_cache_hit_tokens_total{{model="tiny-llama",origin="{origin}",tier="{tier}"}}',
        )
        for tier in ("hot", "ssd")
        for origin in ("self", "peer", "unknown")
    }


def rows(url: str) -> int:
    index = connect_index(url, migrate=False)
    try:
        return index.block_count()
    finally:
        index.close()


def settle(url: str, at_least: int = 1, quiet: float = 1.5, timeout: float = 60) -> int:
    """Wait until the index holds ``at_least`` rows and stops changing (writers drained)."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = rows(url)
        if now != last:
            last, since = now, time.monotonic()
        elif now >= at_least and time.monotonic() - since >= quiet:
            return now
        time.sleep(0.2)
    raise AssertionError(f"the index did not settle: {last} rows")


def _metric(server: ServerProcess, name: str) -> float:
    import httpx

    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no sample {name} in /metrics (renamed or relabelled?)")


def admin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "omlx", "admin", *args], capture_output=True, text=True, timeout=120
    )


def _leftovers(cache: Path, url: str) -> tuple[int, int, int]:
    """(temporary files, block files without rows, rows) in the shared folder and index."""
    from omlx.adapters.blockfiles.store import FileBlockStore

    store = FileBlockStore(cache)
    index = connect_index(url, migrate=False)
    try:
        indexed = index.all_relpaths()
        return (
            len(list(store.iter_temp_files())),
            len(set(store.iter_relpaths()) - indexed),
            len(indexed),
        )
    finally:
        index.close()


def clean_logs(*servers: ServerProcess) -> None:
    for server in servers:
        log = server.read_log()
        for sign in BAD_SIGNS:
            assert sign not in log, f"{server.log_path}: {sign!r}\n{log[-3000:]}"


def test_b_restores_the_prefix_a_computed(
    tiny_model_dir: Path, tmp_path: Path, pg_url: str
) -> None:
    cache = tmp_path / "shared"
    with (
        serve("a", tiny_model_dir, cache, pg_url, tmp_path) as a,
        serve("b", tiny_model_dir, cache, pg_url, tmp_path) as b,
    ):
        first = chat(a, "List the files.")
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        settle(pg_url, at_least=first.usage.prompt_tokens // 16)
        turn = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "List the files."},
        ]
        # B's RAM is empty: every block comes from A's files, and the report says whose.
        replay, header = reported(b, turn, "session-1")
        restored = replay.usage.prompt_tokens_details.cached_tokens
        assert restored == replay.usage.prompt_tokens - 1
        assert replay.choices[0].message.content == first.choices[0].message.content
        assert (header["tier"], header["computed_by"]) == ("ssd", "a")
        assert hit_tokens(b)[("ssd", "peer")] == restored
        # The session's next turn on B: A's blocks are in B's RAM now. B's greedy answer is
        # A's, so the block that holds its first tokens has A's key: B kept its own copy
        # only if its restore took A's partial block rather than A's whole one.
        answer = {"role": "assistant", "content": replay.choices[0].message.content or ""}
        follow = [*turn, answer, {"role": "user", "content": "Now the tests."}]
        after, header = reported(b, follow, "session-1")
        hits = hit_tokens(b)
        assert header["tier"] == "hot"
        assert header["computed_by"] == ("b" if hits[("hot", "self")] else "a")
        assert hits[("hot", "peer")] >= first.usage.prompt_tokens // 16 * 16  # A's whole blocks
        assert sum(hits.values()) == restored + after.usage.prompt_tokens_details.cached_tokens
        assert hits[("ssd", "self")] == hits[("ssd", "unknown")] == hits[("hot", "unknown")] == 0
        assert "session 'session-1'" in b.read_log()
        assert "cache folder reconciled" in a.read_log() + b.read_log()
        clean_logs(a, b)
    assert (
        admin("cache", "verify", "--cache-dir", str(cache), "--index-url", pg_url).returncode == 0
    )
    assert_cache_invariants(cache, index_url=pg_url)


def test_a_second_server_under_one_identity_fails_fast(
    tiny_model_dir: Path, tmp_path: Path, pg_url: str
) -> None:
    cache = tmp_path / "shared"
    with serve("a", tiny_model_dir, cache, pg_url, tmp_path):
        twin = subprocess.run(
            [
                sys.executable,
                "-m",
                "omlx",
                "serve",
                "--model",
                str(tiny_model_dir),
                "--port",
                "1",
                "--paged-ssd-cache-dir",
                str(cache),
                "--index-url",
                pg_url,
                "--server-id",
                "a",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        embedded = subprocess.run(  # an embedded index on a shared folder would reconcile it away
            [
                sys.executable,
                "-m",
                "omlx",
                "serve",
                "--model",
                str(tiny_model_dir),
                "--port",
                "1",
                "--paged-ssd-cache-dir",
                str(cache),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert twin.returncode != 0 and "another server is running as 'a'" in twin.stderr
    assert embedded.returncode != 0 and "in use" in embedded.stderr
    assert "Traceback" not in twin.stderr + embedded.stderr
    assert_cache_invariants(cache, index_url=pg_url)


@pytest.mark.slow
def test_both_writing_one_prefix_at_once_leave_one_row_and_one_file(
    tiny_model_dir: Path, tmp_path: Path, pg_url: str
) -> None:
    cache = tmp_path / "shared"
    with (
        serve("a", tiny_model_dir, cache, pg_url, tmp_path) as a,
        serve("b", tiny_model_dir, cache, pg_url, tmp_path) as b,
    ):
        for round_ in range(3):
            system = f"Round {round_}. " + SYSTEM
            replies: dict[str, object] = {}

            def ask(server: ServerProcess, system: str, replies: dict[str, object]) -> None:
                replies[server.base_url] = chat(server, "Go.", system)

            threads = [threading.Thread(target=ask, args=(s, system, replies)) for s in (a, b)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert len(replies) == 2
            texts = {r.choices[0].message.content for r in replies.values()}  # type: ignore[attr-defined]
            assert len(texts) == 1
        settle(pg_url, at_least=3 * 10)
        clean_logs(a, b)
    assert_cache_invariants(cache, index_url=pg_url)  # rows <=> files: one file per key
    verify = admin("cache", "verify", "--cache-dir", str(cache), "--index-url", pg_url)
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.slow
def test_kill_9_of_a_mid_write_leaves_b_serving_and_nothing_orphaned(
    tiny_model_dir: Path, tmp_path: Path, pg_url: str
) -> None:
    cache = tmp_path / "shared"
    short_grace = {"OMLX_RECONCILE_GRACE_SECONDS": "2"}
    b = serve("b", tiny_model_dir, cache, pg_url, tmp_path, env=short_grace).start()
    a = serve("a", tiny_model_dir, cache, pg_url, tmp_path, env=short_grace).start()
    try:
        errors: list[Exception] = []

        def burst(i: int) -> None:
            try:
                chat(a, f"task {i} " * (i + 3), SYSTEM * 2, 40)
            except Exception as exc:  # the kill ends them
                errors.append(exc)

        threads = [threading.Thread(target=burst, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and rows(pg_url) == 0:
            time.sleep(0.05)
        a.kill()  # SIGKILL while its writer is busy
        for t in threads:
            t.join(60)
        after = chat(b, "Still there?")
        assert after.choices[0].message.content
        restored = chat(b, "task 0 " * 3, SYSTEM * 2)  # what A got onto disk, B serves
        assert restored.usage.prompt_tokens_details.cached_tokens > 0
        left = _leftovers(cache, pg_url)
        time.sleep(2.5)  # past the grace: what A left is now stale to any reconcile
        a = serve("a", tiny_model_dir, cache, pg_url, tmp_path, env=short_grace).start()
        deadline = time.monotonic() + 30
        while a.read_log().count("cache folder reconciled") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        report = [line for line in a.read_log().splitlines() if "cache folder reconciled" in line]
        assert len(report) >= 2, a.read_log()[-2000:]
        assert _leftovers(cache, pg_url)[:2] == (0, 0)  # no temp file, no file without a row
        print(
            f"\nkill -9 of A, then two requests to B: {left[2]} rows, {left[0]} temp files and {left[1]} files "
            f"without rows left; B then served {restored.usage.prompt_tokens_details.cached_tokens} "
            f"cached tokens; A's restart: {report[-1].split('reconciled: ')[-1]}"
        )
    finally:
        a.stop()
        b.stop()
    verify = admin("cache", "verify", "--cache-dir", str(cache), "--index-url", pg_url)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert_cache_invariants(cache, index_url=pg_url)


@pytest.mark.slow
def test_a_tiny_shared_budget_holds_across_both(
    tiny_model_dir: Path, tmp_path: Path, pg_url: str
) -> None:
    cache = tmp_path / "shared"
    budget = 96 * 1024  # about ten blocks of the tiny model, against ~30 per prompt
    env = {"OMLX_EVICTION_LEASE_SECONDS": "0.5"}
    args = ("--paged-ssd-cache-max-size", "96KiB")
    with (
        serve("a", tiny_model_dir, cache, pg_url, tmp_path, *args, env=env) as a,
        serve("b", tiny_model_dir, cache, pg_url, tmp_path, *args, env=env) as b,
    ):
        peak = 0
        for i in range(6):
            server = (a, b)[i % 2]
            reply = chat(server, f"Question {i}.", f"Prompt {i}. " + SYSTEM)
            assert reply.choices[0].message.content
            time.sleep(0.6)
            index = connect_index(pg_url, migrate=False)
            peak = max(peak, index.total_bytes())
            index.close()
        settle(pg_url)
        evicted = [
            _metric(s, 'omlx_cache_blocks_evicted_total{model="all",tier="ssd"}') for s in (a, b)
        ]
        clean_logs(a, b)
    index = connect_index(pg_url, migrate=False)
    total, count = index.total_bytes(), index.block_count()
    index.close()
    assert 0 < total <= budget and count >= 5
    assert peak <= budget + 2 * 10 * 1024  # at most a block in flight per server beyond it
    assert sum(evicted) > 0
    print(
        f"\ntiny shared budget {budget} B: peak {peak} B sampled, final {total} B in {count} "
        f"blocks; evicted by A/B: {evicted[0]}/{evicted[1]} blocks"
    )
    assert_cache_invariants(cache, budget, index_url=pg_url)


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server this test may stop and start again (the session's one serves other tests)."""
    bindir, why = find_bindir()
    if bindir is None:
        pytest.skip(why)
    server = PostgresServer(bindir).start()
    yield server
    server.close()


@pytest.mark.slow
def test_postgres_stopped_mid_run_both_answer_and_recover(
    tiny_model_dir: Path, tmp_path: Path, own_postgres: PostgresServer
) -> None:
    url = own_postgres.create_database()
    cache = tmp_path / "shared"
    with (
        serve("a", tiny_model_dir, cache, url, tmp_path) as a,
        serve("b", tiny_model_dir, cache, url, tmp_path) as b,
    ):
        chat(a, "Warm up.")
        before = settle(url)
        own_postgres.stop()
        try:
            for server in (a, b):  # misses and dropped writes, never a failed request
                for i in range(2):
                    reply = chat(server, f"Outage question {i}.", f"Outage {i}. " + SYSTEM)
                    assert reply.choices[0].message.content
            outage_b = chat(b, "Warm up.")  # A's blocks are on disk, but the index is gone
            assert (
                outage_b.usage.prompt_tokens_details.cached_tokens
                < outage_b.usage.prompt_tokens // 2
            )
        finally:
            own_postgres.start()
        time.sleep(1.5)  # past the index's fail-fast window
        assert (
            rows(url) == before
        )  # what was computed during the outage was dropped, not half-written
        fresh = chat(a, "After the outage.", "Recovered. " + SYSTEM)
        settle(url, at_least=fresh.usage.prompt_tokens // 16)
        replay = chat(b, "After the outage.", "Recovered. " + SYSTEM)
        assert replay.usage.prompt_tokens_details.cached_tokens == replay.usage.prompt_tokens - 1
        for server in (a, b):
            log = server.read_log()
            assert "unreachable" in log and "answers again" in log
            assert "Traceback" not in log and "not served" not in log
    assert_cache_invariants(cache, index_url=url)
    with contextlib.suppress(Exception):
        own_postgres.drop_database(url)

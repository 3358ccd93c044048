"""Sessions routed to the server that holds them, through the HAProxy and nginx configurations
shipped in docs/proxy/ (docs/multi-machine.md, "Routing sessions to the server that holds them").

Each test runs the shipped file itself (tests/proxies.py substitutes the ports) in front of
real ``omlx serve`` processes with the tiny model. Fast: the files are valid; a session key
keeps one server, SGLang's header routes like ours, no key spreads over both; a server down
or still starting gets no request. Slow: a replay of six interleaved sessions on two servers
sharing one cold tier (PostgreSQL index, one folder): with the session header every
follow-up restores from the RAM of the server that served the turn before; without it the
proxy spreads them and a follow-up on the other server restores what it shares from the
shared tier, with the same text.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from omlx.app.early_port import EarlyPort
from tests.cache_header import checked
from tests.proxies import Proxy
from tests.server_process import ServerProcess, free_port, wait_for_writes
from tests.storage_checks import assert_cache_invariants

SYSTEM = "You are an agent working on a shared repository with many tools. " * 12
SESSIONS, TURNS = 6, 4
UPSTREAM = "x-omlx-upstream"  # the shipped configurations name the server that answered


def tiny_server(model: Path, work: Path, name: str, *extra: str) -> ServerProcess:
    return ServerProcess(
        "--model",
        str(model),
        "--block-size",
        "16",
        *extra,
        cache_dir=work / f"cache-{name}",
        log_path=work / f"{name}.log",
    )


@contextlib.contextmanager
def started_together(servers: list[ServerProcess]) -> Iterator[list[ServerProcess]]:
    """Start ``servers`` at once (each start waits for its model), stop them all after."""
    failures: list[BaseException] = []

    def start(server: ServerProcess) -> None:
        try:
            server.start()
        except BaseException as exc:  # raised again below, on the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=start, args=(s,)) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        if failures:
            raise failures[0]
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture(scope="module")
def two_servers(tiny_model_dir: Path, tmp_path_factory) -> Iterator[list[ServerProcess]]:
    """Two servers of their own (no sharing: the fast tests look only at the routing)."""
    work = tmp_path_factory.mktemp("routing")
    with started_together([tiny_server(tiny_model_dir, work, n) for n in ("a", "b")]) as servers:
        yield servers


def client(proxy: Proxy, headers: dict[str, str] | None = None) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=proxy.base_url + "/v1",
        api_key="x",
        max_retries=0,
        timeout=30,
        default_headers=headers or {},
    )


def answered_by(proxy: Proxy, headers: dict[str, str] | None = None) -> str:
    """Which server answered one short chat request sent through ``proxy``."""
    raw = client(proxy, headers).chat.completions.with_raw_response.create(
        model="tiny-llama", messages=[{"role": "user", "content": "Hi."}], max_tokens=1
    )
    assert raw.parse().choices[0].message.content is not None
    return raw.headers[UPSTREAM]


def test_the_shipped_configuration_is_valid(proxy_kind: str, tmp_path: Path) -> None:
    proxy = Proxy(proxy_kind, [free_port(), free_port()], tmp_path / "proxy.log")
    try:
        done = proxy.check()
    finally:
        proxy.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warn" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr


def test_a_session_keeps_its_server_and_no_key_spreads(
    proxy_kind: str,
    two_servers: list[ServerProcess],
    tmp_path: Path,
) -> None:
    with Proxy(proxy_kind, [s.port for s in two_servers], tmp_path / "proxy.log") as proxy:
        homes = {}
        for key in (f"session-{i}" for i in range(SESSIONS)):
            seen = {answered_by(proxy, {"X-Session-ID": key}) for _ in range(2)}
            assert len(seen) == 1, f"{key} went to {seen}"
            homes[key] = seen.pop()
            # A client that sends only SGLang's routing key lands on the same server.
            assert answered_by(proxy, {"X-SMG-Routing-Key": key}) == homes[key]
        assert len(set(homes.values())) == 2, homes  # six keys, both servers
        keyless = {answered_by(proxy) for _ in range(8)}
        assert len(keyless) == 2, keyless


def test_a_server_that_is_down_gets_no_session(
    proxy_kind: str,
    two_servers: list[ServerProcess],
    tmp_path: Path,
) -> None:
    dead = free_port()  # nothing listens: a stopped server
    live = two_servers[0]
    with Proxy(proxy_kind, [dead, live.port], tmp_path / "proxy.log") as proxy:
        for i in range(SESSIONS):
            assert answered_by(proxy, {"X-Session-ID": f"session-{i}"}).endswith(
                ("omlx-2", f":{live.port}")
            )


def test_haproxy_sends_nothing_to_a_server_still_starting(
    two_servers: list[ServerProcess], tmp_path: Path
) -> None:
    # omlx's own early port: /health says "ready": false, any other request is held.
    listener = socket.create_server(("127.0.0.1", 0))
    starting = EarlyPort(listener, lambda: ["loading tiny-llama"]).start()
    try:
        ports = [listener.getsockname()[1], two_servers[1].port]
        with Proxy("haproxy", ports, tmp_path / "proxy.log") as proxy:
            proxy.wait_for_log("omlx-1 is DOWN")
            for i in range(SESSIONS):
                assert answered_by(proxy, {"X-Session-ID": f"session-{i}"}) == "omlx-2"
            assert "omlx-2 is DOWN" not in proxy.log()
    finally:
        starting.hand_over(("127.0.0.1", free_port()))  # any held request: closed
        listener.close()


# --- the replay ----------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    upstream: str
    tier: str  # x-omlx-cache's: hot | ssd | none
    cached: int  # tokens restored (usage.prompt_tokens_details.cached_tokens)
    prompt: int
    text: str


def replay_order(sessions: int, turns: int) -> list[tuple[int, int]]:
    """(session, turn) in sending order: round ``t`` sends every session's turn ``t``.

    Interleaved as agents working at once. Each round starts one session later than the
    last, so five or eleven requests separate two turns of a session: never back to back
    (an agent runs its tools between turns), and an odd number, so a strict round robin
    over two servers sends every follow-up to the other one."""
    return [((t + i) % sessions, t) for t in range(turns) for i in range(sessions)]


def replay(
    proxy: Proxy, with_key: bool, servers: list[ServerProcess]
) -> dict[tuple[int, int], Turn]:
    """Six sessions, each turn resending the conversation so far plus a new user message."""
    clients = {
        s: client(proxy, {"X-Session-ID": f"session-{s}"} if with_key else None)
        for s in range(SESSIONS)
    }
    conversations = {s: [{"role": "system", "content": f"Session {s}. {SYSTEM}"}] for s in clients}
    turns: dict[tuple[int, int], Turn] = {}
    for s, t in replay_order(SESSIONS, TURNS):
        if s == t % SESSIONS:  # a round begins
            wait_for_writes([s.base_url for s in servers])
        messages = [*conversations[s], {"role": "user", "content": f"Step {t}: carry on."}]
        raw = clients[s].chat.completions.with_raw_response.create(
            model="tiny-llama", messages=messages, max_tokens=8, temperature=0
        )
        reply = raw.parse()
        report = checked(raw)  # the header, found to say what usage does
        text = reply.choices[0].message.content or ""
        turns[s, t] = Turn(
            raw.headers[UPSTREAM],
            report["tier"],
            reply.usage.prompt_tokens_details.cached_tokens,
            reply.usage.prompt_tokens,
            text,
        )
        conversations[s] = [*messages, {"role": "assistant", "content": text}]
    return turns


@contextlib.contextmanager
def shared_pair(model: Path, work: Path, url: str) -> Iterator[list[ServerProcess]]:
    """Two servers on one folder and one PostgreSQL index, started together."""
    work.mkdir()
    servers = [
        ServerProcess(
            "--model",
            str(model),
            "--block-size",
            "16",
            "--index-url",
            url,
            "--server-id",
            name,
            cache_dir=work / "shared",
            log_path=work / f"{name}.log",
        )
        for name in ("a", "b")
    ]
    with started_together(servers):
        yield servers
    for s in servers:
        log = s.read_log()
        assert "Traceback" not in log and "not served" not in log, log[-3000:]
    assert_cache_invariants(work / "shared", index_url=url)


@pytest.mark.slow
def test_a_replay_of_six_sessions_follows_the_session_key(
    proxy_kind: str,
    tiny_model_dir: Path,
    tmp_path: Path,
    postgres,
) -> None:
    runs = {}
    for with_key in (True, False):  # each on a fresh cold tier: the first must not feed the second
        work = tmp_path / ("keyed" if with_key else "keyless")
        url = postgres.create_database()
        with (
            shared_pair(tiny_model_dir, work, url) as servers,
            Proxy(proxy_kind, [s.port for s in servers], work / "proxy.log") as proxy,
        ):
            runs[with_key] = replay(proxy, with_key, servers)
        postgres.drop_database(url)
    keyed, keyless = runs[True], runs[False]
    follow_ups = [(s, t) for s, t in keyed if t > 0]
    crossed = 0
    for s, t in follow_ups:
        before, turn = keyed[s, t - 1], keyed[s, t]
        assert turn.upstream == before.upstream, (s, t)
        assert turn.tier == "hot" and turn.cached >= before.prompt, (s, t, turn, before)
        # The same conversation without the key: the same greedy text, and what the keyed
        # run restored from RAM restored here too, from the shared tier where the proxy
        # sent the turn to the other server.
        plain, plain_before = keyless[s, t], keyless[s, t - 1]
        assert plain.text == turn.text, (s, t)
        other = plain.upstream != plain_before.upstream
        crossed += other
        assert plain.tier == ("ssd" if other else "hot"), (s, t, plain)
        assert plain.cached >= 0.99 * turn.cached, (s, t, plain, turn)
    assert len({keyed[s, 0].upstream for s in range(SESSIONS)}) == 2  # the keys use both
    assert crossed > 0
    print(
        f"\n{proxy_kind}: {len(follow_ups)} follow-ups; with the key all tier=hot on the same "
        f"server, cached {sum(keyed[k].cached for k in follow_ups)} tokens; without it "
        f"{crossed} on the other server (tier=ssd), cached {sum(keyless[k].cached for k in follow_ups)}"
    )

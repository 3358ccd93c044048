"""``omlx launch AGENT [ARGS...]``: an agent CLI run against omlx, in the user's terminal.

Uses the omlx already answering on the host and port, or starts one (its log in a file) and
stops it when the agent exits. The agent gets its settings from ``agent_settings``, its
arguments untouched, the terminal, and the last word: its exit status is ours.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from omlx.app.launch.agent_settings import AGENT_MIN_CONTEXT, AGENTS, AgentSetup, setup_for
from omlx.app.launch.find_agent import NOT_FOUND_STATUS, find_agent, local_bin_dir, missing_line
from omlx.app.launch.local_server import (
    LaunchError,
    StartedServer,
    endpoint_of,
    probe,
    wait_ready,
)

MISTAKE_STATUS = 2  # as `omlx serve` exits on a start-up mistake
INTERRUPTED_STATUS = 130  # 128 + SIGINT, as a shell reports it
# Addresses that bind every interface; a client reaches them on loopback.
_ANY_ADDRESS = {"", "0.0.0.0", "::"}


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    agent: str
    agent_args: tuple[str, ...]
    host: str
    port: int
    api_key: str  # the server's key ("" for none)
    serve_args: tuple[str, ...]  # options for a server started here (host and port added)
    home: Path  # omlx's own folder (~/.omlx): the agents' private config, the server's log


def launch(plan: LaunchPlan, say: Callable[[str], None]) -> int:
    """Run the agent; the exit status to leave with. ``say`` writes one line for the user."""
    agent = AGENTS[plan.agent]
    local = local_bin_dir()
    exe = find_agent(agent, None, local)
    if exe is None:
        say(missing_line(agent, local))
        return NOT_FOUND_STATUS
    base_url = f"http://{_client_host(plan.host)}:{plan.port}"
    server: StartedServer | None = None
    try:
        held = probe(base_url)
        if held == "other":
            raise LaunchError(
                f"{plan.host}:{plan.port} is held by something that is not omlx; "
                "pass --port to start omlx on another port"
            )
        if held == "omlx":
            if plan.serve_args:
                say(f"using the omlx already on {base_url}; ignored: {' '.join(plan.serve_args)}")
            wait_ready(base_url)
        else:
            log = plan.home / "logs" / f"serve-{plan.port}.log"
            say(f"starting omlx on {base_url} (log: {log})")
            server = StartedServer.start(
                [*plan.serve_args, "--host", plan.host, "--port", str(plan.port)], log
            )
            try:
                wait_ready(base_url, server.alive)
            except LaunchError:
                raise LaunchError(
                    f"omlx serve exited with status {server.proc.returncode}; "
                    f"the end of {log}:\n{server.log_tail()}"
                ) from None
        endpoint = endpoint_of(base_url, plan.api_key)
        if endpoint.context_length is not None and endpoint.context_length < AGENT_MIN_CONTEXT:
            say(
                f"note: {endpoint.model} has a {endpoint.context_length}-token context; agents "
                f"send 13-25k-token prompts: serve a model of {AGENT_MIN_CONTEXT // 1024}k or more "
                "(--model)"
            )
        setup = setup_for(agent.name, endpoint, plan.home / "agents" / agent.name)
        write_private(setup.files)
        return run_attached([str(exe), *plan.agent_args], agent_env(setup))
    except LaunchError as exc:
        say(str(exc))
        return MISTAKE_STATUS
    except KeyboardInterrupt:  # Ctrl-C while a model loads: stop the server, no traceback
        return INTERRUPTED_STATUS
    finally:
        if server is not None:
            server.stop()


def agent_env(setup: AgentSetup, base: dict[str, str] | None = None) -> dict[str, str]:
    """The user's environment with the agent's settings over it, and the conflicting ones out."""
    env = {**(os.environ if base is None else base), **setup.env}
    for name in setup.unset:
        env.pop(name, None)
    return env


def write_private(files: dict[Path, str]) -> None:
    """Config files readable by their owner only: they may hold the server's API key."""
    for path, text in files.items():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)


def run_attached(cmd: Sequence[str], env: dict[str, str]) -> int:
    """The CLI on this terminal; its exit status (128 + N when killed by signal N).

    Ctrl-C reaches the agent from the terminal itself (one process group), so it is ignored
    here: the agent decides what it means, and the server is still stopped after.
    SIGTERM and SIGHUP sent to ``omlx launch`` are passed on to the agent.
    """
    proc = subprocess.Popen(list(cmd), env=env)

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    handled = {signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: forward, signal.SIGHUP: forward}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handled.items()}
    try:
        status = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - status if status < 0 else status


def _client_host(host: str) -> str:
    if host in _ANY_ADDRESS:
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host

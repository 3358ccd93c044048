"""Where an agent CLI is: on PATH, then in the checkout's ``.agents/`` (scripts/install-agents.sh)."""

from __future__ import annotations

import shutil
from pathlib import Path

from omlx.app.launch.agent_settings import Agent

# src/omlx/app/launch/ -> the checkout, where scripts/install-agents.sh puts the CLIs
_CHECKOUT = Path(__file__).resolve().parents[4]
# What a missing CLI exits with, as a shell's "command not found" does.
NOT_FOUND_STATUS = 127


def local_bin_dir(checkout: Path = _CHECKOUT) -> Path | None:
    """The checkout's ``.agents/node_modules/.bin``; None for an installed omlx (no checkout)."""
    if not (checkout / "scripts" / "install-agents.sh").exists():
        return None
    return checkout / ".agents" / "node_modules" / ".bin"


def find_agent(agent: Agent, path: str | None, local: Path | None) -> Path | None:
    """``path``: the PATH to search (None: the process's)."""
    found = shutil.which(agent.executable, path=path)
    if found is not None:
        return Path(found)
    if local is not None:
        found = shutil.which(agent.executable, path=str(local))
        if found is not None:
            return Path(found)
    return None


def missing_line(agent: Agent, local: Path | None) -> str:
    """One line: where omlx looked, and the npm command that installs the CLI."""
    where = "on PATH" + (f" or in {local}" if local is not None else "")
    return (
        f"{agent.executable} not found {where}; install it with "
        f"`npm install -g {agent.npm_package}`"
        + (" (or scripts/install-agents.sh for this checkout)" if local is not None else "")
    )

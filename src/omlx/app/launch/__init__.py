"""``omlx launch``: an agent CLI (Claude Code, Codex, opencode) run against omlx in one command."""

from omlx.app.launch.agent_settings import AGENTS, AgentSetup, ContextLimits, Endpoint, setup_for
from omlx.app.launch.command import LaunchPlan, launch

__all__ = ["AGENTS", "AgentSetup", "ContextLimits", "Endpoint", "LaunchPlan", "launch", "setup_for"]

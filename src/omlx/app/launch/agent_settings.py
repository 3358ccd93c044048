"""What each agent CLI needs to talk to omlx: environment variables and private config files.

The one place that knows the settings docs/clients/ documents (claude-code.md, codex.md,
opencode-cline.md); ``omlx launch`` applies them and the end-to-end tests reuse them. Pure:
the caller writes the files and starts the CLI.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# Agents compact their conversation at this share of the context (Codex's and opencode's
# trigger, Claude Code's override): the rest is left for the answer and the summary.
COMPACT_PERCENT = 85
# Below this, an agent's first prompt (13-25k tokens: system prompt, tools, environment) may
# not fit (docs/clients/README.md, "Context length").
AGENT_MIN_CONTEXT = 32_768
# Claude Code's CLAUDE_CODE_AUTO_COMPACT_WINDOW reads anything smaller as 100k (and warns).
CLAUDE_MIN_AUTO_COMPACT_WINDOW = 100_000
# Written above the table omlx launch owns in Codex's config.toml; what Codex adds below
# it (trusted projects, notices) is kept from one launch to the next.
CODEX_END_MARKER = "# ---- end of omlx launch's settings; Codex's own below are kept ----"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An omlx server as a client sees it."""

    base_url: str  # http://HOST:PORT, no /v1
    api_key: str  # the server's key, or a placeholder where it has none
    model: str  # the served model's id
    context_length: int | None  # None: not loaded yet, so not known


@dataclass(frozen=True, slots=True)
class ContextLimits:
    """The served model's context, as every agent is told it."""

    window: int
    compact_at: int  # tokens in the conversation that start a compaction

    @classmethod
    def of(cls, context: int) -> ContextLimits:
        return cls(window=context, compact_at=context * COMPACT_PERCENT // 100)

    @property
    def output(self) -> int:
        """The answer's share: what is left above the compaction trigger."""
        return self.window - self.compact_at


@dataclass(frozen=True, slots=True)
class AgentSetup:
    """Environment to set (and to drop) and files to write before starting a CLI."""

    env: dict[str, str]
    unset: tuple[str, ...] = ()
    files: dict[Path, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Agent:
    name: str  # as typed after ``omlx launch``
    executable: str
    npm_package: str


AGENTS = {
    "claude": Agent("claude", "claude", "@anthropic-ai/claude-code"),
    "codex": Agent("codex", "codex", "@openai/codex"),
    "opencode": Agent("opencode", "opencode", "opencode-ai"),
}


def claude_code_setup(endpoint: Endpoint) -> AgentSetup:
    """docs/clients/claude-code.md: the base URL without /v1, a key, every model name pinned."""
    m = endpoint.model
    env = {
        "ANTHROPIC_BASE_URL": endpoint.base_url,  # Claude Code adds /v1/messages
        "ANTHROPIC_API_KEY": endpoint.api_key,
        # Pinned rather than left to the claude-* alias: under a Claude model's name Claude
        # Code assumes that model's window (1M tokens) and never compacts in time.
        "ANTHROPIC_MODEL": m,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": m,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": m,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": m,
        "CLAUDE_CODE_SUBAGENT_MODEL": m,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    if endpoint.context_length is not None:
        limits = ContextLimits.of(endpoint.context_length)
        # Read for models Claude Code does not know, which the pinned names are.
        env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(limits.window)
        env["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] = str(COMPACT_PERCENT)
        if limits.window >= CLAUDE_MIN_AUTO_COMPACT_WINDOW:
            env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(limits.window)
    # Each of these would send the requests to a cloud instead of to omlx.
    unset = (
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_USE_BEDROCK",
        "CLAUDE_CODE_USE_VERTEX",
        "CLAUDE_CODE_USE_FOUNDRY",
    )
    return AgentSetup(env=env, unset=unset)


def codex_config(endpoint: Endpoint, existing: str = "") -> str:
    """docs/clients/codex.md's config.toml, over the part of ``existing`` Codex wrote itself."""
    lines = [
        "# Written by `omlx launch codex` at every launch (docs/clients/codex.md).",
        f"model = {_toml_str(endpoint.model)}",
        'model_provider = "omlx"',
    ]
    if endpoint.context_length is not None:
        limits = ContextLimits.of(endpoint.context_length)
        lines += [
            f"model_context_window = {limits.window}",  # Codex cannot ask omlx
            f"model_auto_compact_token_limit = {limits.compact_at}",
        ]
    lines += [
        "",
        "[model_providers.omlx]",
        'name = "omlx"',
        f"base_url = {_toml_str(endpoint.base_url + '/v1')}",  # Codex adds /responses
        'wire_api = "responses"',  # Codex 0.171 refuses "chat"
        'env_key = "OMLX_API_KEY"',
        CODEX_END_MARKER,
    ]
    _, marker, kept = existing.partition(CODEX_END_MARKER)
    return "\n".join(lines) + (kept if marker else "\n")


def codex_setup(endpoint: Endpoint, codex_home: Path, existing: str = "") -> AgentSetup:
    """Codex in its own CODEX_HOME: the user's ~/.codex is never read or written."""
    return AgentSetup(
        env={"CODEX_HOME": str(codex_home), "OMLX_API_KEY": endpoint.api_key},
        files={codex_home / "config.toml": codex_config(endpoint, existing)},
    )


def opencode_config(endpoint: Endpoint) -> dict:
    """docs/clients/opencode-cline.md's provider, and its model chosen."""
    model: dict = {"name": f"{endpoint.model} on omlx"}
    if endpoint.context_length is not None:
        limits = ContextLimits.of(endpoint.context_length)
        # opencode compacts when a conversation passes context - output.
        model["limit"] = {"context": limits.window, "output": limits.output}
    return {
        "$schema": "https://opencode.ai/config.json",
        "model": f"omlx/{endpoint.model}",
        "small_model": f"omlx/{endpoint.model}",  # titles and summaries: omlx too
        "provider": {
            "omlx": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "omlx",
                "options": {
                    "baseURL": endpoint.base_url + "/v1",
                    "apiKey": endpoint.api_key,
                    "includeUsage": True,
                    "supportsStructuredOutputs": True,
                },
                "models": {endpoint.model: model},
            }
        },
    }


def opencode_setup(endpoint: Endpoint, config_dir: Path) -> AgentSetup:
    """opencode reads OPENCODE_CONFIG beside (above) the user's own config, never changed."""
    path = config_dir / "opencode.json"
    return AgentSetup(
        env={"OPENCODE_CONFIG": str(path)},
        files={path: json.dumps(opencode_config(endpoint), indent=2) + "\n"},
    )


def setup_for(agent: str, endpoint: Endpoint, state_dir: Path) -> AgentSetup:
    """``state_dir``: omlx's own folder for the agent's private config (~/.omlx/agents/NAME)."""
    if agent == "claude":
        return claude_code_setup(endpoint)
    if agent == "codex":
        config = state_dir / "config.toml"
        existing = config.read_text(encoding="utf-8") if config.exists() else ""
        return codex_setup(endpoint, state_dir, existing)
    if agent == "opencode":
        return opencode_setup(endpoint, state_dir)
    raise ValueError(f"unknown agent {agent!r}: one of {', '.join(AGENTS)}")


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string

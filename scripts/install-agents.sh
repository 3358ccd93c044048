#!/usr/bin/env bash
# Install the real agent CLIs the end-to-end tests drive and `omlx launch` finds (Claude Code,
# Codex, opencode) from npm into .agents/ in this checkout (never globally). Pinned versions; safe to re-run: does nothing
# when they are already there. Needs node and npm; exits 3 without them.
set -euo pipefail
cd "$(dirname "$0")/.."

CLAUDE_CODE=${OMLX_CLAUDE_CODE_VERSION:-2.1.332}
CODEX=${OMLX_CODEX_VERSION:-0.171.0}
# opencode-ai is a launcher; its binary comes as an optional platform package
# (opencode-linux-x64 and the like), which npm installs beside it.
OPENCODE=${OMLX_OPENCODE_VERSION:-1.18.33}
PREFIX=.agents

command -v npm >/dev/null && command -v node >/dev/null || { echo "install-agents: node/npm not found" >&2; exit 3; }

installed() {  # name version
  local pkg="$PREFIX/node_modules/$1/package.json"
  [ -f "$pkg" ] && grep -q "\"version\": \"$2\"" "$pkg"
}
if installed @anthropic-ai/claude-code "$CLAUDE_CODE" && installed @openai/codex "$CODEX" \
   && installed opencode-ai "$OPENCODE" \
   && [ -x "$PREFIX/node_modules/.bin/claude" ] && [ -x "$PREFIX/node_modules/.bin/codex" ] \
   && [ -x "$PREFIX/node_modules/.bin/opencode" ]; then
  exit 0
fi
mkdir -p "$PREFIX"
[ -f "$PREFIX/package.json" ] || echo '{"private": true}' > "$PREFIX/package.json"
npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error \
  "@anthropic-ai/claude-code@$CLAUDE_CODE" "@openai/codex@$CODEX" "opencode-ai@$OPENCODE"
"$PREFIX/node_modules/.bin/claude" --version
"$PREFIX/node_modules/.bin/codex" --version
"$PREFIX/node_modules/.bin/opencode" --version

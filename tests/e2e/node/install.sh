#!/bin/sh
# Installs the AI SDK into this folder (node_modules/, gitignored); about ten seconds.
set -e
cd "$(dirname "$0")"
npm install --no-audit --no-fund --loglevel=error

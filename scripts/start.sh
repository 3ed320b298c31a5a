#!/usr/bin/env bash
# Set up .venv and start the gateway on the embedded default: SQLite (./parley.db),
# sessions' workspaces under ./workspaces, and an offline scripted agent unless
# PARLEY_HOST or PARLEY_MODEL names another. Prints the URL of the page to open.
#   scripts/start.sh                        http://127.0.0.1:8000/?token=…
#   scripts/start.sh --bind 127.0.0.1:9000  elsewhere
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/parley gateway "$@"

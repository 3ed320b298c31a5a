#!/usr/bin/env bash
# Set up .venv (only when the project changed: scripts/setup.sh) and start the gateway on
# the embedded default: SQLite (./parley.db), sessions' workspaces under ./workspaces,
# and an offline scripted agent unless PARLEY_HOST or PARLEY_MODEL names another. Its
# last line is the URL of the page to open; the token in it is kept across restarts.
#   scripts/start.sh                        http://127.0.0.1:8000/?token=…
#   scripts/start.sh --bind 127.0.0.1:9000  elsewhere (or PORT=9000 scripts/start.sh)
#   scripts/start.sh --new-token            with a new token (open pages lock)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/parley gateway "$@"

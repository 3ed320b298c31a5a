#!/usr/bin/env bash
# Set up and run the demo: the whole story offline, on SQLite, in about ten seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/parley demo "$@"

#!/usr/bin/env bash
# Set up and run every check: lint, format, types, then the test suite.
# Tests that need PostgreSQL use PARLEY_TEST_PG_URL (default: postgres on 127.0.0.1:5432,
# trust auth); they fail, never skip, when it is unreachable.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports
set +e
.venv/bin/pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$status"

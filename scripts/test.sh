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
# Two test processes (pytest-xdist), each file on one of them: most of the suite's time
# is fleets and servers waiting, so two share the machine's two cores well.
# PARLEY_TEST_PROCESSES=0 runs it in this one.
.venv/bin/pytest -n "${PARLEY_TEST_PROCESSES:-2}" --dist loadfile "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$status"

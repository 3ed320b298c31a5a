#!/usr/bin/env bash
# Create .venv (if missing) and install parley into it, with the dev tools if asked:
#   scripts/setup.sh        runtime only
#   scripts/setup.sh dev    plus pytest, hypothesis, ruff, mypy
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if [ "${1:-}" = dev ]; then
    .venv/bin/python -m pip install --quiet -e '.[dev]'
else
    .venv/bin/python -m pip install --quiet -e .
fi

#!/usr/bin/env bash
# Create .venv (if missing) and install parley into it, with the dev tools if asked:
#   scripts/setup.sh        runtime only
#   scripts/setup.sh dev    plus pytest, hypothesis, ruff, mypy
# The install is editable, so a change to the code needs none: it runs again only when
# what it installs from changed (pyproject.toml, this script), as a stamp in .venv
# records, or for dev tools a runtime install lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
mode=${1:-runtime}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
stamp=.venv/.parley-setup
project=$("$python" -c '
import hashlib, sys
digest = hashlib.sha256()
for path in sys.argv[1:]:
    digest.update(open(path, "rb").read())
print(digest.hexdigest())
' pyproject.toml scripts/setup.sh)
installed=$(cat "$stamp" 2>/dev/null || true)
# A dev install holds the runtime one.
if [ "$installed" = "$project dev" ] || [ "$installed" = "$project $mode" ]; then
    exit 0
fi
rm -f "$stamp"
.venv/bin/python -m pip install --quiet --upgrade pip
if [ "$mode" = dev ]; then
    .venv/bin/python -m pip install --quiet -e '.[dev]'
else
    .venv/bin/python -m pip install --quiet -e .
fi
echo "$project $mode" > "$stamp"

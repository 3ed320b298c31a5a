"""``python -m parley``: the command line."""

from parley.cli import main

raise SystemExit(main())

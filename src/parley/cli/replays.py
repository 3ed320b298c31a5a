"""``parley replay``: replay the sessions a file lists against a model as one batch, wait
for them, and write the report as a page and as JSON beside it; or (``--batch``) write
the report of a replay batch made before (docs/replay.md#many)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from parley.cli.batch_progress import follow
from parley.cli.connecting import client_for
from parley.errors import InvalidRequest
from parley.replay_page import render


def session_ids(path: str) -> list[str]:
    """The ids of ``path``: one a line, blank lines and ``#`` comments skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read --sessions {path!r}: {exc}") from exc
    ids = [line.strip() for line in text.splitlines()]
    ids = [i for i in ids if i and not i.startswith("#")]
    if not ids:
        raise InvalidRequest(f"--sessions {path!r} lists no session id")
    return ids


def replay(args: argparse.Namespace, console: Console) -> int:
    ids = session_ids(args.sessions) if args.sessions else None  # refused before anything
    page = Path(args.report)
    if page.suffix.lower() not in (".html", ".htm"):
        raise InvalidRequest("--report names the page to write: a .html file")
    with client_for(args, runs_turns=True) as client:
        if ids is None:
            many = client.replay_batch(args.batch)
        else:
            many = client.replay_many(
                ids, model=args.model, system_prompt=args.system_prompt, tools=args.tools
            )
        # The batch's id first, as `parley batch submit` prints it: `parley batch status`
        # follows it, and `parley replay --batch` writes its report again.
        print(many.batch_id, flush=True)
        turns = sum(len(r.pairs) for r in many.replays)
        console.print(f"replaying {len(many.replays)} sessions as {turns} turns")
        if console.is_terminal and args.timeout is None:
            follow(many.batch, console)
        many.wait(args.timeout)
        report = many.report()
    page.write_text(render(report), encoding="utf-8")
    page.with_suffix(".json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    totals = report["totals"]
    console.print(
        f"{totals['turns']} turns, {totals['changed']} changed, mean similarity "
        f"{totals['similarity']}: {page} and {page.with_suffix('.json')}",
        markup=False,
    )
    return 0

"""``parley schedule add|list|pause|resume|delete`` (docs/reference.md#command-line):
``add`` prints the id alone and stores the schedule in its zone; ``list`` shows it,
paused or with its next slot; a bad cron, zone or overlap is one clear line, exit 2,
and stores nothing."""

from __future__ import annotations

import json
from pathlib import Path

from parley import connect
from tests.acceptance.test_cli import parley


def test_add_list_pause_resume_delete(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'parley.db'}"
    assert parley("--db", db, "migrate").returncode == 0
    added = parley(
        "--db",
        db,
        "schedule",
        "add",
        "0 9 * * 1-5",
        "summarise",
        "--timezone",
        "Europe/Paris",
        "--overlap",
        "enqueue",
        "--root",
        str(tmp_path),
    )
    assert added.returncode == 0, added.stderr
    schedule_id = added.stdout.strip()
    with connect(db) as client:
        stored = client.get_schedule(schedule_id).record()
    assert (stored.cron, stored.timezone, stored.overlap.value) == (
        "0 9 * * 1-5",
        "Europe/Paris",
        "enqueue",
    )
    assert stored.next_at is not None

    listed = parley("--db", db, "schedule", "list")
    assert schedule_id in listed.stdout and "Europe/Paris" in listed.stdout
    assert parley("--db", db, "schedule", "pause", schedule_id).returncode == 0
    [paused] = json.loads(parley("--db", db, "schedule", "list", "--json").stdout)
    assert paused["paused"] is True and paused["next_at"] is None
    assert parley("--db", db, "schedule", "resume", schedule_id).returncode == 0
    [resumed] = json.loads(parley("--db", db, "schedule", "list", "--json").stdout)
    assert resumed["paused"] is False and resumed["next_at"] is not None
    assert parley("--db", db, "schedule", "delete", schedule_id).returncode == 0
    assert json.loads(parley("--db", db, "schedule", "list", "--json").stdout) == []


def test_bad_input_is_one_line_and_stores_nothing(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'parley.db'}"
    assert parley("--db", db, "migrate").returncode == 0
    for argv in (
        ["61 * * * *", "p"],
        ["* * * * *", "p", "--timezone", "Mars/Olympus"],
        ["* * * * *", "p", "--overlap", "sometimes"],
    ):
        refused = parley("--db", db, "schedule", "add", *argv)
        assert refused.returncode == 2, refused.stderr
        assert refused.stdout == "" and len(refused.stderr.strip().splitlines()) == 1
    assert json.loads(parley("--db", db, "schedule", "list", "--json").stdout) == []
    missing = parley("--db", db, "schedule", "pause", "0" * 36)
    assert missing.returncode != 0 and "no schedule" in missing.stderr

"""The chaos soak as CI runs it: three minutes of mixed load on a fleet with RabbitMQ as
its broker, every kind of fault striking at least once, and the history checker finding
nothing.  The long soak (thirty minutes, 50 turns/s) is the same program run by hand:
``python -m tests.soak`` (docs/soak.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.soak.faults import KINDS
from tests.support.fleet import REPO

MINUTES = 3
RATE = 8


@pytest.mark.soak
@pytest.mark.timeout(MINUTES * 60 + 600)
def test_three_minutes_of_every_fault_at_once_lose_and_double_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    argv = [sys.executable, "-m", "tests.soak", "--minutes", str(MINUTES), "--rate", str(RATE)]
    argv += ["--sessions", "400", "--broker", "amqp", "--calm", "20", "--out", str(out)]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=MINUTES * 60 + 540)
    printed = run.stdout[-20_000:] + run.stderr[-5_000:]
    assert (out / "report.json").exists(), printed
    report = json.loads((out / "report.json").read_text())
    assert set(report["faults"]) == {kind.name for kind in KINDS}, printed
    assert report["faults that failed to strike"] == [], printed
    assert report["violations"] == 0 and report["client errors"] == [], printed
    assert report["turns accepted"] > MINUTES * 60 * RATE / 2, printed  # the load ran
    assert report["crash → resumed (s)"]["n"] > 0, printed  # a crash caught turns mid-run
    assert run.returncode == 0, printed

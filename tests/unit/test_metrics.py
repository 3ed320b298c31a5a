"""The metrics' declarations against their documentation and exposition, their labels'
bounds, the metrics port's parsing, and that instrumentation never fails a turn."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import parley
from parley.coordination.local_coordinator import LocalCoordinator
from parley.engine.emitter import Emitter
from parley.metrics_export import MetricsBind, exposition
from parley.schemas.errors import Fenced
from parley.schemas.events import Ended, Event
from parley.schemas.messages import ToolCall
from parley.schemas.records import TurnStatus
from parley.settings import Settings
from parley.telemetry import metrics
from tests.support.scrape import Samples, parse
from tests.unit.test_tool_calls import Recorder, runner

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The table under docs/operations.md's ``## Metrics``: name → (type, labels)."""
    section = OPERATIONS.read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    found = {}
    for line in section.splitlines():
        if line.startswith("| `parley_"):
            name, kind, labels = (cell.strip() for cell in line.strip("|").split("|")[:3])
            found[name.strip("`")] = (
                kind,
                tuple(label.strip(" `") for label in labels.split(",") if label.strip()),
            )
    return found


def test_every_metric_is_documented_with_its_type_and_labels() -> None:
    names = [spec.name for spec in metrics.METRICS]
    assert len(set(names)) == len(names) and all(n.startswith("parley_") for n in names)
    assert documented() == {spec.name: (spec.kind, spec.labels) for spec in metrics.METRICS}


def scraped() -> Samples:
    body, content_type = exposition()
    assert content_type.startswith("text/plain")
    return parse(body.decode())


def test_the_exposition_lists_every_metric_with_its_type_from_the_first_scrape() -> None:
    families = scraped().families
    for spec in metrics.METRICS:
        assert families[spec.base] == spec.kind, spec.name


def test_an_unknown_tools_name_is_not_a_label_value(tmp_path: Path) -> None:
    tools, _ = runner(tmp_path, Recorder("ran"))
    before = scraped()
    tools.run(ToolCall(id="c1", name="made-up-by-the-model", arguments="{}"), step=0)
    tools.run(ToolCall(id="c2", name="echo", arguments='{"path": "secrets/x"}'), step=0)
    after = scraped()
    assert "made-up-by-the-model" not in after.label_values("parley_tool_calls_total", "tool")
    for tool in (metrics.UNKNOWN_TOOL, "echo"):
        delta = after.value("parley_tool_calls_total", tool=tool) - before.value(
            "parley_tool_calls_total", tool=tool
        )
        assert delta == 1, tool
    rule = "deny_read:secrets/**"
    assert (
        after.value("parley_refusals_total", rule=rule)
        - before.value("parley_refusals_total", rule=rule)
        == 1
    )


def claimed(attempts: int = 0, previous: str = "queued", held: Any = None) -> Any:
    """What metrics read of a claimed turn (submitted three seconds ago)."""
    return SimpleNamespace(
        run=SimpleNamespace(attempts=attempts, held_step=held),
        previous_status=previous,
        turn=SimpleNamespace(created_at=datetime.now(UTC) - timedelta(seconds=3)),
    )


@pytest.mark.parametrize(
    ("attempts", "previous", "held", "start"),
    [
        (0, "queued", None, "new"),
        (1, "running", None, "takeover"),
        (1, "queued", {"index": 0}, "answers"),
        (2, "queued", None, "resume"),
    ],
)
def test_a_claim_says_how_its_turn_starts(
    attempts: int, previous: str, held: Any, start: str
) -> None:
    assert metrics.start_of(claimed(attempts, previous, held)) == start


def test_a_driven_turn_is_in_flight_until_its_driver_lets_it_go() -> None:
    before = scraped()
    in_flight = before.value("parley_turns_in_flight")
    with metrics.Driving(claimed()):
        assert scraped().value("parley_turns_in_flight") == in_flight + 1
    after = scraped()
    assert after.value("parley_turns_in_flight") == in_flight
    started = "parley_turns_started_total"
    assert after.value(started, start="new") - before.value(started, start="new") == 1
    waited = after.value("parley_queue_wait_seconds_sum") - before.value(
        "parley_queue_wait_seconds_sum"
    )
    assert waited >= 3  # submitted three seconds before its claim
    with pytest.raises(Fenced), metrics.Driving(claimed(1, "running")):
        raise Fenced("another driver took the session")
    lost = scraped()
    assert lost.value("parley_turns_in_flight") == in_flight
    takeovers = "parley_crash_takeovers_total"
    assert lost.value(takeovers) - after.value(takeovers) == 1
    assert lost.value("parley_queue_wait_seconds_count") == after.value(
        "parley_queue_wait_seconds_count"
    )  # only a first claim waited in the queue


class CountingCoordinator(LocalCoordinator):
    """Records, as each event is published, what the metrics say then."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, float]] = []

    def publish(self, events: Sequence[Event], fence: int = 0, *, now: bool = False) -> None:
        for event in events:
            self.seen.append((event.kind.value, scraped().value("parley_turns_ended_total")))
        super().publish(events, fence, now=now)


def test_an_end_is_counted_before_anyone_can_see_it() -> None:
    coordinator = CountingCoordinator()
    emitter = Emitter("t", 1, coordinator)
    before = scraped()
    emitter.publish(emitter.allocate(Ended(outcome="cancelled")))
    # The total as the end went out already held it.
    assert coordinator.seen == [("end", before.value("parley_turns_ended_total") + 1)]
    after = scraped()
    for name in ("parley_turns_ended_total", "parley_turn_duration_seconds_count"):
        assert after.value(name, outcome="cancelled") - before.value(name, outcome="cancelled") == 1


def test_instrumentation_that_fails_is_swallowed_and_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> Any:
        raise OSError("the metrics directory is gone")

    monkeypatch.setattr(metrics, "instruments", broken)
    monkeypatch.setattr(metrics, "_failed", set())
    with caplog.at_level(logging.WARNING, logger="parley.metrics"):
        for _ in range(3):
            metrics.turn_submitted()
            metrics.tool_called("echo")
        with metrics.Driving(claimed()):
            metrics.turn_ended("finished", 1.0)
    failures = [r for r in caplog.records if "metrics:" in r.getMessage()]
    named = sorted(r.getMessage().split()[1] for r in failures)
    assert named == ["_turn_claimed", "_turn_let_go", "tool_called", "turn_ended", "turn_submitted"]


def test_a_turn_runs_while_every_metric_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def broken() -> Any:
        raise RuntimeError("broken registry")

    monkeypatch.setattr(metrics, "instruments", broken)
    monkeypatch.setattr(metrics, "_failed", set())
    root = tmp_path / "repo"
    root.mkdir()
    (root / "a.txt").write_text("x")
    script = {
        "rules": [
            {
                "when": ".*",
                "steps": [
                    {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
                    {"text": "read it"},
                ],
            }
        ]
    }
    host = parley.Host(model=parley.models.ScriptedModel(script))
    with parley.connect(f"sqlite:///{tmp_path / 'p.db'}", host=host) as client:
        result = client.open_session(root).turn("read")
    assert (result.outcome, result.reply, result.steps) == (TurnStatus.FINISHED, "read it", 2)


@pytest.mark.parametrize(
    ("value", "host", "port"),
    [
        ("9100", "0.0.0.0", 9100),
        ("127.0.0.1:9101", "127.0.0.1", 9101),
        ("[::1]:9102", "::1", 9102),
        (" 9103 ", "0.0.0.0", 9103),
    ],
)
def test_the_metrics_port_is_a_port_or_host_and_port(value: str, host: str, port: int) -> None:
    settings = Settings.from_environment({"PARLEY_METRICS_PORT": value})
    assert MetricsBind.from_settings(settings) == MetricsBind(host=host, port=port)


@pytest.mark.parametrize("value", ["ninety", "0", "65536", "host:", ":9100", "9100:host", "-1"])
def test_a_malformed_metrics_port_is_refused(value: str) -> None:
    with pytest.raises(parley.errors.InvalidRequest, match="PARLEY_METRICS_PORT"):
        MetricsBind.from_settings(Settings.from_environment({"PARLEY_METRICS_PORT": value}))


def test_no_metrics_port_serves_nothing() -> None:
    assert MetricsBind.from_settings(Settings.from_environment({})) is None
    assert MetricsBind.from_settings(Settings.from_environment({"PARLEY_METRICS_PORT": ""})) is None


def test_the_turns_waiting_for_an_event_gauge_reads_zero_once_a_tenant_waits_no_more() -> None:
    metrics.turns_waiting_event({"acme": 3, "globex": 1})
    assert scraped().value("parley_turns_waiting_event", tenant="acme") == 3
    metrics.turns_waiting_event({"globex": 2})
    after = scraped()
    assert after.value("parley_turns_waiting_event", tenant="acme") == 0
    assert after.value("parley_turns_waiting_event", tenant="globex") == 2
    metrics.turns_waiting_event({})

"""``parley status`` says how many turns of each tenant and lane wait for an event, the
soonest of their deadlines, and what each listed turn waits for and until when
(docs/time.md#what-an-operator-sees-of-a-wait)."""

from __future__ import annotations

from datetime import UTC, datetime

from parley.schemas.records import TurnStatus
from parley.status import FleetStatus, _lane_lines
from parley.store.status import LaneWork, UnfinishedTurn, UnfinishedWork

DEADLINE = datetime(2027, 1, 4, 8, 0, tzinfo=UTC)


def test_a_lane_with_turns_waiting_for_an_event_is_listed_with_the_soonest_deadline() -> None:
    lanes = (
        LaneWork(
            tenant="acme",
            priority="interactive",
            unfinished=3,
            waiting_capacity=0,
            waiting_event=2,
            event_deadline=DEADLINE,
        ),
        LaneWork(
            tenant="", priority="interactive", unfinished=1, waiting_capacity=0, waiting_event=1
        ),
    )
    assert _lane_lines(lanes) == [
        "by tenant and priority:",
        "  acme interactive: 3 unfinished, 0 waiting for capacity, 2 waiting for an event "
        "(the soonest deadline at 2027-01-04T08:00:00+00:00)",
        "  (no tenant) interactive: 1 unfinished, 0 waiting for capacity, 1 waiting for an event",
    ]


def test_a_turn_waiting_for_an_event_says_which_and_until_when() -> None:
    now = datetime(2027, 1, 4, 7, 0, tzinfo=UTC)

    def waiting(turn_id: str, event: str | None, until: datetime | None) -> UnfinishedTurn:
        return UnfinishedTurn(
            turn_id=turn_id,
            session_id="s",
            status=TurnStatus.WAITING,
            worker=None,
            steps=0,
            attempts=1,
            queued_at=now,
            started_at=now,
            asked_at=None,
            event=event,
            until=until,
        )

    turns = (
        waiting("a", "finance.approved", DEADLINE),
        waiting("b", "go", None),
        waiting("c", None, DEADLINE),
    )
    work = UnfinishedWork(
        counts={TurnStatus.QUEUED: 0, TurnStatus.RUNNING: 0, TurnStatus.WAITING: 3},
        oldest_queued_at=None,
        turns={TurnStatus.QUEUED: (), TurnStatus.RUNNING: (), TurnStatus.WAITING: turns},
    )
    status = FleetStatus(
        deployment="embedded",
        database="sqlite://",
        redis=None,
        redis_reachable=None,
        work=work,
        at=now,
        stranded=frozenset(),
        workers=None,
    )
    text = "\n".join(status.lines())
    assert "turn a of session s: 0 steps, waiting for event finance.approved (until " in text
    assert "2027-01-04T08:00:00+00:00)" in text
    assert "turn b of session s: 0 steps, waiting for event go\n" in text + "\n"
    assert "turn c of session s: 0 steps, waiting for a time (until 2027-01-04" in text
    shown = {t["turn_id"]: t for t in status.to_json()["waiting"]}
    assert (shown["a"]["event"], shown["a"]["until"]) == ("finance.approved", DEADLINE.isoformat())
    assert (shown["b"]["event"], shown["b"]["until"]) == ("go", None)

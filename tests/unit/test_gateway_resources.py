"""The gateway's wire forms read a stored record's fields by name: every field of a turn
and of a child turn reaches the wire, none is dropped or swapped."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from parley.gateway.resources import Child, Turn
from parley.schemas.records import ChildRecord, TurnRecord, TurnStatus, Waiting


def test_a_turns_wire_form_has_every_field_of_its_record() -> None:
    record = TurnRecord(
        turn_id="turn-1",
        session_id="session-1",
        parent_id="turn-0",
        prompt="hello",
        status=TurnStatus.WAITING,
        reply=None,
        run_id="run-1",
        request_id="req-1",
        created_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        not_before=datetime(2026, 1, 2, 4, 0, 0, tzinfo=UTC),
        waiting_for=Waiting.TIME,
    )
    wire = Turn.of(record)
    fields = dataclasses.asdict(record)
    assert wire.model_dump() == {name: fields[name] for name in Turn.model_fields}


def test_a_childs_wire_form_has_every_field_of_its_record() -> None:
    record = ChildRecord(
        step=2,
        call_id="call-7",
        agent="writer/critic",
        turn_id="turn-9",
        session_id="session-9",
        status=TurnStatus.SUCCEEDED,
    )
    assert Child.of(record).model_dump() == dataclasses.asdict(record)

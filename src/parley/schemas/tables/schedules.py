"""Schedules (docs/time.md#schedules): cron prompts in a time zone, and each slot's fate.

A schedule's ``next_at`` is its next slot in UTC (None while paused), indexed: beat's
look for due schedules reads only those due, never those waiting for later.  A slot is
claimed by inserting its ``schedule_runs`` row, whose key is the schedule and the slot:
the transaction that inserts it also submits the slot's turn (or records it skipped or
missed) and moves ``next_at`` on, so a slot is fired once whatever number of beats look
and whatever crashes between them.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)

from parley.schemas.tables.metadata import Id, Timestamp, metadata

schedules = Table(
    "schedules",
    metadata,
    Column("id", Id, primary_key=True),
    # The gateway's tenant that owns it (None: made from Python, unowned).
    Column("tenant", String(64), nullable=True),
    Column("name", Text, nullable=True),
    # Five fields, read in ``timezone`` (an IANA name).
    Column("cron", String(200), nullable=False),
    Column("timezone", String(100), nullable=False),
    Column("prompt", Text, nullable=False),
    # The session each firing is a turn of; None: each firing opens a session on
    # ``root`` (the schedule's tenant owns it).
    Column("session_id", Id, nullable=True),
    Column("root", Text, nullable=True),
    Column("priority", String(20), nullable=False),
    # ``skip``, ``enqueue`` or ``interrupt``: what a firing does while the previous
    # firing's turn has not ended.
    Column("overlap", String(16), nullable=False),
    Column("paused", Boolean, nullable=False),
    # How late a slot may still fire (a beat back from an outage); older: ``missed``.
    Column("misfire_grace_seconds", Integer, nullable=False),
    Column("next_at", Timestamp, nullable=True),
    # The turn the last firing submitted (what ``overlap`` looks at).
    Column("last_turn_id", Id, nullable=True),
    Column("created_at", Timestamp, nullable=False),
    Index(None, "next_at"),
    Index(None, "tenant", "created_at", "id"),
)

schedule_runs = Table(
    "schedule_runs",
    metadata,
    Column("schedule_id", Id, ForeignKey("schedules.id"), nullable=False),
    # The slot, in UTC: with the schedule, unique (the claim).
    Column("slot_at", Timestamp, nullable=False),
    # ``fired``, ``skipped`` or ``missed``.
    Column("status", String(16), nullable=False),
    Column("turn_id", Id, nullable=True),
    Column("session_id", Id, nullable=True),
    Column("recorded_at", Timestamp, nullable=False),
    PrimaryKeyConstraint("schedule_id", "slot_at"),
)

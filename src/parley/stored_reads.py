"""What a client reads as stored, without running anything: sessions, turns, runs, steps,
approvals and events by id, for callers (the gateway's routes) that answer with records
rather than with a :class:`~parley.Session` or :class:`~parley.TurnHandle`."""

from __future__ import annotations

from parley.client_runtime import Runtime
from parley.ports.backend import CommittedStep
from parley.schemas.events import Event
from parley.schemas.records import Approval, RunState, SessionRecord, TurnRecord
from parley.store.sql_store import SqlStore


class StoredReads:
    """The reads a :class:`~parley.Client` answers from its store: one query each, no
    check of who owns what (the gateway's tenants check that) and no log scope bound."""

    runtime: Runtime

    @property
    def store(self) -> SqlStore:
        """The store the reads are answered from (the client's runtime's)."""
        return self.runtime.store

    def ping(self) -> bool:
        """Whether the database answers."""
        return self.store.ping()

    def session_record(self, session_id: str) -> SessionRecord:
        """A session as stored now; :class:`~parley.errors.SessionNotFound` if unknown."""
        return self.store.get_session(session_id)

    def session_records(
        self, *, tenant: str, limit: int, before: str | None = None, batch_sessions: bool = True
    ) -> list[SessionRecord]:
        """A tenant's sessions, newest first, at most ``limit``; ``before`` (a session id)
        pages on after it; without ``batch_sessions``, only its conversations (not the
        sessions its batches' lines opened)."""
        return self.store.list_sessions(
            tenant=tenant, limit=limit, before=before, batch_sessions=batch_sessions
        )

    def history_of(self, session_id: str) -> list[TurnRecord]:
        """A session's turns from the root to the head: what the model sees."""
        return self.store.history(session_id)

    def tree_of(self, session_id: str) -> list[TurnRecord]:
        """Every turn of every branch of a session, in submission order."""
        return self.store.tree(session_id)

    def turn_record(self, turn_id: str) -> TurnRecord:
        """A turn as stored now; :class:`~parley.errors.TurnNotFound` if unknown."""
        return self.store.get_turn(turn_id)

    def turn_and_tenant(self, turn_id: str) -> tuple[TurnRecord, str | None]:
        """A turn and the tenant that owns its session (None: created from Python), in
        one read."""
        return self.store.turn_and_tenant(turn_id)

    def run_state(self, turn_id: str) -> RunState:
        """The state of a turn's run: its status, error, usage, counts."""
        return self.store.run_state(turn_id)

    def steps_of(self, turn_id: str) -> list[CommittedStep]:
        """A turn's committed steps, in order."""
        return self.store.steps_of(turn_id)

    def approvals_of(self, turn_id: str) -> tuple[Approval, ...]:
        """Every call of a turn that asked a person, answered or not, oldest first."""
        return self.store.approvals(turn_id)

    def stored_events(self, turn_id: str, after: int = 0) -> list[Event]:
        """A turn's stored events with seq > ``after``, in order (those still only
        published are not among them: :meth:`~parley.TurnHandle.events` follows both)."""
        return self.store.events_after(turn_id, after)

    def stored_seq(self, turn_id: str) -> int:
        """The newest seq among a turn's stored events (0 before the first)."""
        return self.store.last_event_seq(turn_id)

"""The store: parley's durable state, one transaction per method, on SQLite (embedded)
and PostgreSQL (fleet); the SQL itself lives, named, in :mod:`parley.store.statements`.

:class:`SqlStore` is composed of repositories, one per aggregate and each in a module of
its own (sessions, seeded histories, approvals, steers, submissions, a turn's reads,
claims, sub-agents' child turns, compactions, turn ends and the driver's protocol,
files, batches and their acceptance, the batch window, leases, retention, the webhook
outbox, status, schedules), which share one :class:`~parley.store.connection.Transactions` (the
engine and its transaction plumbing) and are handed the others they use.  The store
exposes every repository method as its own (:mod:`parley.store.exposing`), so that it
is the one store port the engine talks to and what clients read and write.

Concurrency rules:

* A session row is the lock for submissions and the fence for commits: every step and
  turn commit updates it ``WHERE fence = :fence``, so a driver whose token is stale
  changes nothing (:class:`Fenced`).
* A run row is the lock for its steer inbox: ``say`` and the inbox close both update it
  first, so a steer is either seen by the close (one more step) or refused (``TurnEnded``).
* Step inserts are ``ON CONFLICT DO NOTHING`` and guarded by ``runs.steps = :index``, so a
  commit retried after a cold shutdown can never write a step twice.
"""

from __future__ import annotations

from sqlalchemy.engine import Engine

from parley.ports.backend import Store
from parley.schemas.errors import StoreError
from parley.store import statements as q
from parley.store.approvals import ApprovalStore
from parley.store.batch_acceptance import AcceptanceStore
from parley.store.batches import BatchStore
from parley.store.child_turns import ChildTurnStore
from parley.store.claims import Claims
from parley.store.compactions import CompactionStore
from parley.store.connection import Transactions
from parley.store.database import (
    DEFAULT_ROLE,
    MAX_OVERFLOW,
    POOL_SIZE,
    create_database_engine,
)
from parley.store.exposing import exposed
from parley.store.files import FileStore
from parley.store.leases import LeaseStore
from parley.store.outbox import OutboxStore
from parley.store.replay_batches import ReplayBatchStore
from parley.store.retention import RetentionStore
from parley.store.schedules import ScheduleStore
from parley.store.seeding import SeedStore
from parley.store.sessions import SessionStore
from parley.store.status import StatusStore
from parley.store.steering import SteerStore
from parley.store.submissions import SubmissionStore
from parley.store.turn_ends import TurnEnds
from parley.store.turn_reads import TurnReads
from parley.store.turn_runs import TurnRunStore
from parley.store.waits import WaitStore
from parley.store.window import WindowStore


class SqlStore(Store):
    """parley's durable state on SQLite or PostgreSQL (see the module docstring): the
    store port the engine talks to, and what clients read and write."""

    def __init__(self, engine: Engine) -> None:
        self.db = db = Transactions(engine)
        self.engine = engine
        self.sessions = SessionStore(db)
        self.seeds = SeedStore(db)
        self.approval_store = ApprovalStore(db)
        self.claims = Claims(db)
        self.waits = WaitStore(db, self.claims)
        self.steers = SteerStore(db, self.approval_store, self.waits)
        self.submissions = SubmissionStore(db, self.approval_store, self.steers)
        self.turns = TurnReads(db, self.approval_store)
        self.children = ChildTurnStore(db, self.claims)
        self.compaction_store = CompactionStore(db)
        self.ends = TurnEnds(db, self.claims, self.children)
        self.runs = TurnRunStore(db, self.claims, self.ends)
        self.files = FileStore(db)
        self.batches = BatchStore(db)
        self.acceptance = AcceptanceStore(db, self.batches, self.submissions)
        self.replay_batches = ReplayBatchStore(db, self.acceptance)
        self.window = WindowStore(db)
        self.leases = LeaseStore(db)
        self.retention = RetentionStore(db)
        self.outbox = OutboxStore(db)
        self.status = StatusStore(db)
        self.schedule_store = ScheduleStore(db, self.submissions)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        pool_size: int = POOL_SIZE,
        max_overflow: int = MAX_OVERFLOW,
        role: str = DEFAULT_ROLE,
        pooler: str | None = None,
    ) -> SqlStore:
        """A store on a new engine for ``url`` (the options: those of
        :func:`~parley.store.database.create_database_engine`)."""
        return cls(
            create_database_engine(
                url, pool_size=pool_size, max_overflow=max_overflow, role=role, pooler=pooler
            )
        )

    def close(self) -> None:
        """Release every pooled connection."""
        self.db.close()

    @property
    def transactions(self) -> int:
        """How many transactions the process has begun on this store (logs, benchmarks)."""
        return self.db.transactions

    @property
    def thread_transactions(self) -> int:
        """How many transactions the calling thread has begun on this store."""
        return self.db.thread_transactions

    def ping(self) -> bool:
        """Whether the database answers now (readiness checks)."""
        try:
            self.db.reading(lambda db: db.execute(q.PING).scalar_one())
        except StoreError:
            return False
        return True

    @property
    def sessions_per_prune(self) -> int:
        """Sessions a prune deletes per transaction (the retention repository's)."""
        return self.retention.sessions_per_prune

    def table_counts(self) -> dict[str, int]:
        """Row counts per table (for benchmarks and storage checks)."""
        with self.db.tx() as db:
            return {name: int(db.execute(count).scalar_one()) for name, count in q.ROW_COUNTS}

    # sessions as clients see them (SessionStore)
    create_session = exposed("sessions", SessionStore.create_session)
    create_replay_session = exposed("sessions", SessionStore.create_replay_session)
    list_sessions = exposed("sessions", SessionStore.list_sessions)
    get_session = exposed("sessions", SessionStore.get_session)
    set_title = exposed("sessions", SessionStore.set_title)
    branch = exposed("sessions", SessionStore.branch)
    history = exposed("sessions", SessionStore.history)
    path = exposed("sessions", SessionStore.path)
    tree = exposed("sessions", SessionStore.tree)

    # seeded histories (SeedStore)
    seed_history = exposed("seeds", SeedStore.seed_history)
    seeded = exposed("seeds", SeedStore.seeded)

    # approvals and their answers (ApprovalStore)
    approvals = exposed("approval_store", ApprovalStore.approvals)
    answer_approval = exposed("approval_store", ApprovalStore.answer_approval)
    expire_approvals = exposed("approval_store", ApprovalStore.expire_approvals)

    # calls waiting for an event, and the signals sent to them (WaitStore)
    hold_for_event = exposed("waits", WaitStore.hold_for_event)
    waits_of_step = exposed("waits", WaitStore.waits_of_step)
    signal_turn = exposed("waits", WaitStore.signal_turn)
    release_due_waits = exposed("waits", WaitStore.release_due_waits)
    waiting_for_events = exposed("waits", WaitStore.waiting_for_events)

    # steers said to a turn (SteerStore)
    add_steer = exposed("steers", SteerStore.add_steer)
    accept_steer = exposed("steers", SteerStore.accept_steer)
    pending_steers = exposed("steers", SteerStore.pending_steers)

    # submissions and resumes (SubmissionStore)
    submit_turn = exposed("submissions", SubmissionStore.submit_turn)
    resume_turn = exposed("submissions", SubmissionStore.resume_turn)

    # a turn's reads (TurnReads)
    turn_and_tenant = exposed("turns", TurnReads.turn_and_tenant)
    get_turn = exposed("turns", TurnReads.get_turn)
    turn_result = exposed("turns", TurnReads.turn_result)
    children_of_run = exposed("turns", TurnReads.children_of_run)
    turn_usage = exposed("turns", TurnReads.turn_usage)
    run_state = exposed("turns", TurnReads.run_state)
    steps_of = exposed("turns", TurnReads.steps_of)
    events_after = exposed("turns", TurnReads.events_after)
    last_event_seq = exposed("turns", TurnReads.last_event_seq)

    # taking a session, claiming its next turn (Claims)
    warm_claims = exposed("claims", Claims.warm_claims)
    start_drive = exposed("claims", Claims.start_drive)

    # sub-agents' child turns (ChildTurnStore)
    children_of_step = exposed("children", ChildTurnStore.children_of_step)
    unfinished_children = exposed("children", ChildTurnStore.unfinished_children)
    hold_for_agents = exposed("children", ChildTurnStore.hold_for_agents)
    resumable_children = exposed("children", ChildTurnStore.resumable_children)
    resume_for_agents = exposed("children", ChildTurnStore.resume_for_agents)

    # compactions of a session's history (CompactionStore)
    compactions = exposed("compaction_store", CompactionStore.compactions)
    drop_compaction = exposed("compaction_store", CompactionStore.drop_compaction)
    add_compaction = exposed("compaction_store", CompactionStore.add_compaction)
    compacted_path = exposed("compaction_store", CompactionStore.compacted_path)
    frozen_prefix = exposed("compaction_store", CompactionStore.frozen_prefix)

    # the driver's protocol (TurnRunStore)
    sessions_with_work = exposed("runs", TurnRunStore.sessions_with_work)
    sessions_with_work_lanes = exposed("runs", TurnRunStore.sessions_with_work_lanes)
    release_due_runs = exposed("runs", TurnRunStore.release_due_runs)
    defer_run = exposed("runs", TurnRunStore.defer_run)
    compact_for_run = exposed("runs", TurnRunStore.compact_for_run)
    set_trace_context = exposed("runs", TurnRunStore.set_trace_context)
    commit_step = exposed("runs", TurnRunStore.commit_step)
    hold_step = exposed("runs", TurnRunStore.hold_step)
    approvals_of_run = exposed("runs", TurnRunStore.approvals_of_run)
    consume_approval = exposed("runs", TurnRunStore.consume_approval)
    close_inbox = exposed("runs", TurnRunStore.close_inbox)
    finish_turn = exposed("runs", TurnRunStore.finish_turn)

    # files (FileStore)
    create_file = exposed("files", FileStore.create_file)
    get_file = exposed("files", FileStore.get_file)
    file_part = exposed("files", FileStore.file_part)
    delete_upload = exposed("files", FileStore.delete_upload)
    set_file_bytes = exposed("files", FileStore.set_file_bytes)
    list_files = exposed("files", FileStore.list_files)
    stored_bytes = exposed("files", FileStore.stored_bytes)
    delete_file = exposed("files", FileStore.delete_file)
    prune_uploads = exposed("files", FileStore.prune_uploads)

    # batches, their lines and cancels (BatchStore)
    get_batch = exposed("batches", BatchStore.get_batch)
    batch_header = exposed("batches", BatchStore.batch_header)
    list_batches = exposed("batches", BatchStore.list_batches)
    all_batches = exposed("batches", BatchStore.all_batches)
    batch_lines = exposed("batches", BatchStore.batch_lines)
    lines_ended_after = exposed("batches", BatchStore.lines_ended_after)
    refused_lines = exposed("batches", BatchStore.refused_lines)
    rendered_turns = exposed("batches", BatchStore.rendered_turns)
    cancel_batch = exposed("batches", BatchStore.cancel_batch)
    prune_batches = exposed("batches", BatchStore.prune_batches)

    # a batch's acceptance (AcceptanceStore)
    open_batch = exposed("acceptance", AcceptanceStore.open_batch)
    batch_by_request = exposed("acceptance", AcceptanceStore.batch_by_request)
    accept_lines = exposed("acceptance", AcceptanceStore.accept_lines)
    finish_batch = exposed("acceptance", AcceptanceStore.finish_batch)
    drop_batch = exposed("acceptance", AcceptanceStore.drop_batch)
    abandoned_acceptances = exposed("acceptance", AcceptanceStore.abandoned_acceptances)

    # a replay batch's lines (ReplayBatchStore)
    open_replay_line = exposed("replay_batches", ReplayBatchStore.open_replay_line)
    finish_replay_batch = exposed("replay_batches", ReplayBatchStore.finish_replay_batch)

    # the batch window and the interactive share (WindowStore)
    batch_runs_in_flight = exposed("window", WindowStore.batch_runs_in_flight)
    place_batch_runs = exposed("window", WindowStore.place_batch_runs)
    interactive_load = exposed("window", WindowStore.interactive_load)
    placed_batch_sessions = exposed("window", WindowStore.placed_batch_sessions)

    # embedded session leases (LeaseStore)
    take_lease = exposed("leases", LeaseStore.take_lease)
    take_lease_of = exposed("leases", LeaseStore.take_lease_of)
    renew_leases = exposed("leases", LeaseStore.renew_leases)
    release_lease = exposed("leases", LeaseStore.release_lease)
    leases_of = exposed("leases", LeaseStore.leases_of)
    lease_holders = exposed("leases", LeaseStore.lease_holders)

    # pruning (RetentionStore)
    expired_sessions = exposed("retention", RetentionStore.expired_sessions)
    awaiting_deliveries = exposed("retention", RetentionStore.awaiting_deliveries)
    sessions_with_retention = exposed("retention", RetentionStore.sessions_with_retention)
    turn_count = exposed("retention", RetentionStore.turn_count)
    prune_sessions = exposed("retention", RetentionStore.prune_sessions)

    # webhook deliveries (OutboxStore)
    claim_due = exposed("outbox", OutboxStore.claim_due)
    record_delivered = exposed("outbox", OutboxStore.record_delivered)
    record_failed = exposed("outbox", OutboxStore.record_failed)
    has_unsettled_deliveries = exposed("outbox", OutboxStore.has_unsettled_deliveries)
    deliveries = exposed("outbox", OutboxStore.deliveries)
    delivery = exposed("outbox", OutboxStore.delivery)
    add_push_config = exposed("outbox", OutboxStore.add_push_config)
    push_configs = exposed("outbox", OutboxStore.push_configs)
    delete_push_config = exposed("outbox", OutboxStore.delete_push_config)

    # schedules and the firing of their slots (ScheduleStore)
    create_schedule = exposed("schedule_store", ScheduleStore.create_schedule)
    get_schedule = exposed("schedule_store", ScheduleStore.get_schedule)
    list_schedules = exposed("schedule_store", ScheduleStore.list_schedules)
    update_schedule = exposed("schedule_store", ScheduleStore.update_schedule)
    delete_schedule = exposed("schedule_store", ScheduleStore.delete_schedule)
    schedule_runs = exposed("schedule_store", ScheduleStore.schedule_runs)
    schedule_counts = exposed("schedule_store", ScheduleStore.schedule_counts)
    due_schedules = exposed("schedule_store", ScheduleStore.due_schedules)
    fire_schedule = exposed("schedule_store", ScheduleStore.fire_schedule)

    # the fleet's status (StatusStore)
    work_by_lane = exposed("status", StatusStore.work_by_lane)
    waiting_for_capacity = exposed("status", StatusStore.waiting_for_capacity)
    agent_work = exposed("status", StatusStore.agent_work)
    unfinished_work = exposed("status", StatusStore.unfinished_work)

"""Every SQL statement parley runs, built once and named: the store's catalogue.

Statements take their values as bind parameters, so SQLAlchemy compiles each one once
per dialect and a call only binds values (building a statement per call cost more than
running it).  Bind names carry a ``b_`` prefix (:mod:`~workers.store.statements.binds`).
Row locks (``FOR UPDATE``) render on PostgreSQL only; SQLite serialises writers with
``BEGIN IMMEDIATE`` instead.

One module per concern: sessions, turns, runs, events (steps and events), steers,
approvals, seeds (imported history), leases, fleet_state (``parley status``), outbox
(webhook deliveries), retention (pruning), and dialect (the statements whose SQL differs
per dialect).  The store's modules read them all through this package, as ``q.NAME``.
"""

from workers.store.statements.approvals import (
    APPROVAL as APPROVAL,
)
from workers.store.statements.approvals import (
    APPROVALS_OF_RUN as APPROVALS_OF_RUN,
)
from workers.store.statements.approvals import (
    APPROVALS_OF_TURN as APPROVALS_OF_TURN,
)
from workers.store.statements.approvals import (
    CONSUME_APPROVAL as CONSUME_APPROVAL,
)
from workers.store.statements.approvals import (
    DECIDE_APPROVAL as DECIDE_APPROVAL,
)
from workers.store.statements.approvals import (
    EXPIRED_APPROVALS as EXPIRED_APPROVALS,
)
from workers.store.statements.approvals import (
    HOLD_RUN as HOLD_RUN,
)
from workers.store.statements.approvals import (
    INSERT_APPROVAL as INSERT_APPROVAL,
)
from workers.store.statements.approvals import (
    REQUEUE_WAITING as REQUEUE_WAITING,
)
from workers.store.statements.approvals import (
    TAKE_SEQS as TAKE_SEQS,
)
from workers.store.statements.approvals import (
    UNDECIDED_IDS_OF_RUN as UNDECIDED_IDS_OF_RUN,
)
from workers.store.statements.approvals import (
    UNDECIDED_OF_RUN as UNDECIDED_OF_RUN,
)
from workers.store.statements.binds import (
    MAX_INSERT_ROWS as MAX_INSERT_ROWS,
)
from workers.store.statements.binds import (
    b as b,
)
from workers.store.statements.binds import (
    many_rows as many_rows,
)
from workers.store.statements.binds import (
    row_key as row_key,
)
from workers.store.statements.dialect import (
    RUN_PREFIX as RUN_PREFIX,
)
from workers.store.statements.dialect import (
    SESSION_COLUMNS as SESSION_COLUMNS,
)
from workers.store.statements.dialect import (
    DialectStatements as DialectStatements,
)
from workers.store.statements.events import (
    EVENT_COLUMNS as EVENT_COLUMNS,
)
from workers.store.statements.events import (
    EVENTS_AFTER as EVENTS_AFTER,
)
from workers.store.statements.events import (
    INSERT_QUEUED as INSERT_QUEUED,
)
from workers.store.statements.events import (
    LAST_EVENT_SEQ as LAST_EVENT_SEQ,
)
from workers.store.statements.events import (
    STEPS_OF_RUNS as STEPS_OF_RUNS,
)
from workers.store.statements.fleet_state import (
    PING as PING,
)
from workers.store.statements.fleet_state import (
    ROW_COUNTS as ROW_COUNTS,
)
from workers.store.statements.fleet_state import (
    UNFINISHED_BY_STATUS as UNFINISHED_BY_STATUS,
)
from workers.store.statements.fleet_state import (
    UNFINISHED_OF_STATUS as UNFINISHED_OF_STATUS,
)
from workers.store.statements.fleet_state import (
    WORK_BY_LANE as WORK_BY_LANE,
)
from workers.store.statements.leases import (
    LEASE_HOLDER as LEASE_HOLDER,
)
from workers.store.statements.leases import (
    LEASES_OF as LEASES_OF,
)
from workers.store.statements.leases import (
    RELEASE_LEASE as RELEASE_LEASE,
)
from workers.store.statements.leases import (
    RENEW_LEASES as RENEW_LEASES,
)
from workers.store.statements.leases import (
    TAKE_LEASE_OF_THE_DEAD as TAKE_LEASE_OF_THE_DEAD,
)
from workers.store.statements.outbox import (
    ANY_UNSETTLED as ANY_UNSETTLED,
)
from workers.store.statements.outbox import (
    CLAIM_DUE as CLAIM_DUE,
)
from workers.store.statements.outbox import (
    DELIVERIES_OF_SESSION as DELIVERIES_OF_SESSION,
)
from workers.store.statements.outbox import (
    DELIVERY as DELIVERY,
)
from workers.store.statements.outbox import (
    INSERT_DELIVERY as INSERT_DELIVERY,
)
from workers.store.statements.outbox import (
    RECORD_DELIVERED as RECORD_DELIVERED,
)
from workers.store.statements.outbox import (
    RECORD_FAILED as RECORD_FAILED,
)
from workers.store.statements.outbox import (
    UNSETTLED as UNSETTLED,
)
from workers.store.statements.retention import (
    ANY_WITH_RETENTION as ANY_WITH_RETENTION,
)
from workers.store.statements.retention import (
    LOCK_SESSION_TO_PRUNE as LOCK_SESSION_TO_PRUNE,
)
from workers.store.statements.retention import (
    PAGE as PAGE,
)
from workers.store.statements.retention import (
    PRUNE_DELETES as PRUNE_DELETES,
)
from workers.store.statements.retention import (
    PRUNED_TABLES as PRUNED_TABLES,
)
from workers.store.statements.retention import (
    ROOT_IN_USE as ROOT_IN_USE,
)
from workers.store.statements.retention import (
    TURN_COUNT_OF_SESSION as TURN_COUNT_OF_SESSION,
)
from workers.store.statements.retention import (
    TURN_IDS_OF_SESSION as TURN_IDS_OF_SESSION,
)
from workers.store.statements.retention import (
    expired_awaiting_delivery as expired_awaiting_delivery,
)
from workers.store.statements.retention import (
    expired_candidates as expired_candidates,
)
from workers.store.statements.retention import (
    still_expired as still_expired,
)
from workers.store.statements.run_status import (
    ACTIVE as ACTIVE,
)
from workers.store.statements.run_status import (
    IS_ACTIVE as IS_ACTIVE,
)
from workers.store.statements.run_status import (
    IS_UNFINISHED as IS_UNFINISHED,
)
from workers.store.statements.run_status import (
    QUEUED as QUEUED,
)
from workers.store.statements.run_status import (
    RESUMABLE as RESUMABLE,
)
from workers.store.statements.run_status import (
    RUNNING as RUNNING,
)
from workers.store.statements.run_status import (
    UNFINISHED as UNFINISHED,
)
from workers.store.statements.run_status import (
    WAITING as WAITING,
)
from workers.store.statements.run_status import (
    WAITING_IN_LINE as WAITING_IN_LINE,
)
from workers.store.statements.runs import (
    ACTIVE_RUNS as ACTIVE_RUNS,
)
from workers.store.statements.runs import (
    ADVANCE_RUN as ADVANCE_RUN,
)
from workers.store.statements.runs import (
    CHARGE_RUN as CHARGE_RUN,
)
from workers.store.statements.runs import (
    CLAIM_RUN as CLAIM_RUN,
)
from workers.store.statements.runs import (
    CLOSE_INBOX as CLOSE_INBOX,
)
from workers.store.statements.runs import (
    CLOSE_RUNNING as CLOSE_RUNNING,
)
from workers.store.statements.runs import (
    DEFER_RUN as DEFER_RUN,
)
from workers.store.statements.runs import (
    END_RUN as END_RUN,
)
from workers.store.statements.runs import (
    END_RUN_WITH_STEP as END_RUN_WITH_STEP,
)
from workers.store.statements.runs import (
    INSERT_RUN as INSERT_RUN,
)
from workers.store.statements.runs import (
    LOCK_RUN as LOCK_RUN,
)
from workers.store.statements.runs import (
    LOCK_RUN_BY_TURN as LOCK_RUN_BY_TURN,
)
from workers.store.statements.runs import (
    NEXT_RUN as NEXT_RUN,
)
from workers.store.statements.runs import (
    RESUME_RUN as RESUME_RUN,
)
from workers.store.statements.runs import (
    RUN_BY_ID as RUN_BY_ID,
)
from workers.store.statements.runs import (
    RUN_BY_TURN as RUN_BY_TURN,
)
from workers.store.statements.runs import (
    RUN_ID_OF_TURN as RUN_ID_OF_TURN,
)
from workers.store.statements.runs import (
    RUN_STATUS as RUN_STATUS,
)
from workers.store.statements.runs import (
    SESSION_OF_TURN as SESSION_OF_TURN,
)
from workers.store.statements.runs import (
    SET_TRACE_CONTEXT as SET_TRACE_CONTEXT,
)
from workers.store.statements.runs import (
    WAKE_DEFERRED as WAKE_DEFERRED,
)
from workers.store.statements.seeds import (
    INSERT_SEED as INSERT_SEED,
)
from workers.store.statements.seeds import (
    SEED_OF_SESSION as SEED_OF_SESSION,
)
from workers.store.statements.seeds import (
    SEED_RUN as SEED_RUN,
)
from workers.store.statements.seeds import (
    SEED_TURN as SEED_TURN,
)
from workers.store.statements.seeds import (
    SET_TURN_COUNT as SET_TURN_COUNT,
)
from workers.store.statements.sessions import (
    BUMP_TURN_COUNT as BUMP_TURN_COUNT,
)
from workers.store.statements.sessions import (
    CHARGE_SESSION as CHARGE_SESSION,
)
from workers.store.statements.sessions import (
    FINISH_SESSION as FINISH_SESSION,
)
from workers.store.statements.sessions import (
    INSERT_PREFIX as INSERT_PREFIX,
)
from workers.store.statements.sessions import (
    INSERT_SESSION as INSERT_SESSION,
)
from workers.store.statements.sessions import (
    LOCK_SESSION as LOCK_SESSION,
)
from workers.store.statements.sessions import (
    PREFIX as PREFIX,
)
from workers.store.statements.sessions import (
    SESSION as SESSION,
)
from workers.store.statements.sessions import (
    SESSIONS_OF_TENANT as SESSIONS_OF_TENANT,
)
from workers.store.statements.sessions import (
    SESSIONS_OF_TENANT_BEFORE as SESSIONS_OF_TENANT_BEFORE,
)
from workers.store.statements.sessions import (
    SESSIONS_WITH_WORK as SESSIONS_WITH_WORK,
)
from workers.store.statements.sessions import (
    SET_GENERATION as SET_GENERATION,
)
from workers.store.statements.sessions import (
    SET_HEAD as SET_HEAD,
)
from workers.store.statements.sessions import (
    SET_TITLE as SET_TITLE,
)
from workers.store.statements.sessions import (
    SET_TITLE_IF_NONE as SET_TITLE_IF_NONE,
)
from workers.store.statements.sessions import (
    TAKE_FENCE as TAKE_FENCE,
)
from workers.store.statements.steers import (
    COUNT_STEER as COUNT_STEER,
)
from workers.store.statements.steers import (
    INSERT_STEER as INSERT_STEER,
)
from workers.store.statements.steers import (
    PENDING_STEERS as PENDING_STEERS,
)
from workers.store.statements.turns import (
    CHILD_OF_TURN as CHILD_OF_TURN,
)
from workers.store.statements.turns import (
    INSERT_TURN as INSERT_TURN,
)
from workers.store.statements.turns import (
    PATH as PATH,
)
from workers.store.statements.turns import (
    SET_PARENT as SET_PARENT,
)
from workers.store.statements.turns import (
    TREE as TREE,
)
from workers.store.statements.turns import (
    TURN as TURN,
)
from workers.store.statements.turns import (
    TURN_AND_TENANT as TURN_AND_TENANT,
)
from workers.store.statements.turns import (
    TURN_BY_REQUEST as TURN_BY_REQUEST,
)
from workers.store.statements.turns import (
    TURN_COLUMNS as TURN_COLUMNS,
)
from workers.store.statements.turns import (
    TURN_OWNER as TURN_OWNER,
)

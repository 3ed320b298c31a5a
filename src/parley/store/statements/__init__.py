"""Every SQL statement parley runs, built once and named: the store's catalogue.

Statements take their values as bind parameters, so SQLAlchemy compiles each one once
per dialect and a call only binds values (building a statement per call cost more than
running it).  Bind names carry a ``b_`` prefix (:mod:`~parley.store.statements.binds`).
Row locks (``FOR UPDATE``) render on PostgreSQL only; SQLite serialises writers with
``BEGIN IMMEDIATE`` instead.

One module per concern: sessions, turns, runs, events (steps and events), steers,
approvals, seeds (imported history), leases, fleet_state (``parley status``), outbox
(webhook deliveries), retention (pruning), and dialect (the statements whose SQL differs
per dialect).  The store's modules read them all through this package, as ``q.NAME``.
"""

from parley.store.statements.agents import (
    BATCH_CHILDREN as BATCH_CHILDREN,
)
from parley.store.statements.agents import (
    CANCELLED_CHILDREN_OF_STEP as CANCELLED_CHILDREN_OF_STEP,
)
from parley.store.statements.agents import (
    CHILDREN_OF_RUN as CHILDREN_OF_RUN,
)
from parley.store.statements.agents import (
    CHILDREN_OF_STEP as CHILDREN_OF_STEP,
)
from parley.store.statements.agents import (
    DESCENDANTS_USAGE as DESCENDANTS_USAGE,
)
from parley.store.statements.agents import (
    HOLD_BACK_CHILD as HOLD_BACK_CHILD,
)
from parley.store.statements.agents import (
    HOLD_FOR_AGENTS as HOLD_FOR_AGENTS,
)
from parley.store.statements.agents import (
    NEXT_HELD_BACK_CHILD as NEXT_HELD_BACK_CHILD,
)
from parley.store.statements.agents import (
    PLACE_CHILD as PLACE_CHILD,
)
from parley.store.statements.agents import (
    REQUEUE_PARENT as REQUEUE_PARENT,
)
from parley.store.statements.agents import (
    RUN_WITH_CHILDREN_BY_TURN as RUN_WITH_CHILDREN_BY_TURN,
)
from parley.store.statements.agents import (
    SET_HELD_STEP as SET_HELD_STEP,
)
from parley.store.statements.agents import (
    TURN_ORDINAL as TURN_ORDINAL,
)
from parley.store.statements.agents import (
    UNFINISHED_CHILD_TURNS as UNFINISHED_CHILD_TURNS,
)
from parley.store.statements.agents import (
    UNFINISHED_CHILDREN as UNFINISHED_CHILDREN,
)
from parley.store.statements.approvals import (
    APPROVAL as APPROVAL,
)
from parley.store.statements.approvals import (
    APPROVALS_OF_RUN as APPROVALS_OF_RUN,
)
from parley.store.statements.approvals import (
    APPROVALS_OF_TURN as APPROVALS_OF_TURN,
)
from parley.store.statements.approvals import (
    CONSUME_APPROVAL as CONSUME_APPROVAL,
)
from parley.store.statements.approvals import (
    DECIDE_APPROVAL as DECIDE_APPROVAL,
)
from parley.store.statements.approvals import (
    EXPIRED_APPROVALS as EXPIRED_APPROVALS,
)
from parley.store.statements.approvals import (
    HOLD_RUN as HOLD_RUN,
)
from parley.store.statements.approvals import (
    INSERT_APPROVAL as INSERT_APPROVAL,
)
from parley.store.statements.approvals import (
    REQUEUE_WAITING as REQUEUE_WAITING,
)
from parley.store.statements.approvals import (
    TAKE_SEQS as TAKE_SEQS,
)
from parley.store.statements.approvals import (
    UNDECIDED_IDS_OF_RUN as UNDECIDED_IDS_OF_RUN,
)
from parley.store.statements.approvals import (
    UNDECIDED_OF_RUN as UNDECIDED_OF_RUN,
)
from parley.store.statements.binds import (
    MAX_INSERT_ROWS as MAX_INSERT_ROWS,
)
from parley.store.statements.binds import (
    b as b,
)
from parley.store.statements.binds import (
    many_rows as many_rows,
)
from parley.store.statements.binds import (
    row_key as row_key,
)
from parley.store.statements.compactions import (
    ANY_NATIVE as ANY_NATIVE,
)
from parley.store.statements.compactions import (
    COMPACTION as COMPACTION,
)
from parley.store.statements.compactions import (
    COMPACTIONS_OF_SESSION as COMPACTIONS_OF_SESSION,
)
from parley.store.statements.compactions import (
    COUNT_COMPACTIONS_OF_SESSION as COUNT_COMPACTIONS_OF_SESSION,
)
from parley.store.statements.compactions import (
    DROP_COMPACTION as DROP_COMPACTION,
)
from parley.store.statements.compactions import (
    INSERT_COMPACTION as INSERT_COMPACTION,
)
from parley.store.statements.compactions import (
    LIVE_COMPACTION_THROUGH as LIVE_COMPACTION_THROUGH,
)
from parley.store.statements.compactions import (
    LIVE_COMPACTIONS_THROUGH as LIVE_COMPACTIONS_THROUGH,
)
from parley.store.statements.compactions import (
    NOTE_EVENT_ON_RUN as NOTE_EVENT_ON_RUN,
)
from parley.store.statements.dialect import (
    RUN_PREFIX as RUN_PREFIX,
)
from parley.store.statements.dialect import (
    SESSION_COLUMNS as SESSION_COLUMNS,
)
from parley.store.statements.dialect import (
    DialectStatements as DialectStatements,
)
from parley.store.statements.events import (
    EVENT_COLUMNS as EVENT_COLUMNS,
)
from parley.store.statements.events import (
    EVENTS_AFTER as EVENTS_AFTER,
)
from parley.store.statements.events import (
    INSERT_QUEUED as INSERT_QUEUED,
)
from parley.store.statements.events import (
    LAST_EVENT_SEQ as LAST_EVENT_SEQ,
)
from parley.store.statements.events import (
    STEPS_OF_RUNS as STEPS_OF_RUNS,
)
from parley.store.statements.fleet_state import (
    AGENT_WORK as AGENT_WORK,
)
from parley.store.statements.fleet_state import (
    CAPACITY_BY_LANE as CAPACITY_BY_LANE,
)
from parley.store.statements.fleet_state import (
    PING as PING,
)
from parley.store.statements.fleet_state import (
    ROW_COUNTS as ROW_COUNTS,
)
from parley.store.statements.fleet_state import (
    UNFINISHED_BY_STATUS as UNFINISHED_BY_STATUS,
)
from parley.store.statements.fleet_state import (
    UNFINISHED_OF_STATUS as UNFINISHED_OF_STATUS,
)
from parley.store.statements.fleet_state import (
    WORK_BY_LANE as WORK_BY_LANE,
)
from parley.store.statements.leases import (
    BATCH_LINE_HOLDERS as BATCH_LINE_HOLDERS,
)
from parley.store.statements.leases import (
    LEASE_HOLDER as LEASE_HOLDER,
)
from parley.store.statements.leases import (
    LEASE_HOLDERS as LEASE_HOLDERS,
)
from parley.store.statements.leases import (
    LEASES_OF as LEASES_OF,
)
from parley.store.statements.leases import (
    RELEASE_LEASE as RELEASE_LEASE,
)
from parley.store.statements.leases import (
    RENEW_LEASES as RENEW_LEASES,
)
from parley.store.statements.leases import (
    TAKE_LEASE_OF_THE_DEAD as TAKE_LEASE_OF_THE_DEAD,
)
from parley.store.statements.outbox import (
    ANY_UNSETTLED as ANY_UNSETTLED,
)
from parley.store.statements.outbox import (
    CLAIM_DUE as CLAIM_DUE,
)
from parley.store.statements.outbox import (
    DELETE_PUSH_CONFIG as DELETE_PUSH_CONFIG,
)
from parley.store.statements.outbox import (
    DELIVERIES_OF_SESSION as DELIVERIES_OF_SESSION,
)
from parley.store.statements.outbox import (
    DELIVERY as DELIVERY,
)
from parley.store.statements.outbox import (
    INSERT_DELIVERY as INSERT_DELIVERY,
)
from parley.store.statements.outbox import (
    INSERT_PUSH_CONFIG as INSERT_PUSH_CONFIG,
)
from parley.store.statements.outbox import (
    LOCK_RUN_OF_TURN as LOCK_RUN_OF_TURN,
)
from parley.store.statements.outbox import (
    PUSH_CONFIGS_OF_TURN as PUSH_CONFIGS_OF_TURN,
)
from parley.store.statements.outbox import (
    RECORD_DELIVERED as RECORD_DELIVERED,
)
from parley.store.statements.outbox import (
    RECORD_FAILED as RECORD_FAILED,
)
from parley.store.statements.outbox import (
    UNSETTLED as UNSETTLED,
)
from parley.store.statements.retention import (
    ANY_WITH_RETENTION as ANY_WITH_RETENTION,
)
from parley.store.statements.retention import (
    LOCK_SESSIONS_TO_PRUNE as LOCK_SESSIONS_TO_PRUNE,
)
from parley.store.statements.retention import (
    PAGE as PAGE,
)
from parley.store.statements.retention import (
    PRUNE_DELETES as PRUNE_DELETES,
)
from parley.store.statements.retention import (
    PRUNED_TABLES as PRUNED_TABLES,
)
from parley.store.statements.retention import (
    ROOT_IN_USE as ROOT_IN_USE,
)
from parley.store.statements.retention import (
    TURN_COUNT_OF_SESSION as TURN_COUNT_OF_SESSION,
)
from parley.store.statements.retention import (
    TURNS_OF_SESSIONS as TURNS_OF_SESSIONS,
)
from parley.store.statements.retention import (
    expired_awaiting_delivery as expired_awaiting_delivery,
)
from parley.store.statements.retention import (
    expired_candidates as expired_candidates,
)
from parley.store.statements.retention import (
    still_expired as still_expired,
)
from parley.store.statements.run_status import (
    ACTIVE as ACTIVE,
)
from parley.store.statements.run_status import (
    IS_ACTIVE as IS_ACTIVE,
)
from parley.store.statements.run_status import (
    IS_UNFINISHED as IS_UNFINISHED,
)
from parley.store.statements.run_status import (
    QUEUED as QUEUED,
)
from parley.store.statements.run_status import (
    RESUMABLE as RESUMABLE,
)
from parley.store.statements.run_status import (
    RUNNING as RUNNING,
)
from parley.store.statements.run_status import (
    UNFINISHED as UNFINISHED,
)
from parley.store.statements.run_status import (
    WAITING as WAITING,
)
from parley.store.statements.run_status import (
    WAITING_IN_LINE as WAITING_IN_LINE,
)
from parley.store.statements.runs import (
    ACTIVE_RUNS as ACTIVE_RUNS,
)
from parley.store.statements.runs import (
    ADVANCE_RUN as ADVANCE_RUN,
)
from parley.store.statements.runs import (
    CHARGE_RUN as CHARGE_RUN,
)
from parley.store.statements.runs import (
    CLAIM_RUN as CLAIM_RUN,
)
from parley.store.statements.runs import (
    CLOSE_INBOX as CLOSE_INBOX,
)
from parley.store.statements.runs import (
    CLOSE_RUNNING as CLOSE_RUNNING,
)
from parley.store.statements.runs import (
    DEFER_RUN as DEFER_RUN,
)
from parley.store.statements.runs import (
    END_RUN as END_RUN,
)
from parley.store.statements.runs import (
    END_RUN_WITH_STEP as END_RUN_WITH_STEP,
)
from parley.store.statements.runs import (
    INSERT_RUN as INSERT_RUN,
)
from parley.store.statements.runs import (
    LOCK_RUN as LOCK_RUN,
)
from parley.store.statements.runs import (
    LOCK_RUN_BY_TURN as LOCK_RUN_BY_TURN,
)
from parley.store.statements.runs import (
    NEXT_RUN as NEXT_RUN,
)
from parley.store.statements.runs import (
    RELEASE_DUE as RELEASE_DUE,
)
from parley.store.statements.runs import (
    RESUME_RUN as RESUME_RUN,
)
from parley.store.statements.runs import (
    RUN_BY_ID as RUN_BY_ID,
)
from parley.store.statements.runs import (
    RUN_BY_TURN as RUN_BY_TURN,
)
from parley.store.statements.runs import (
    RUN_ID_OF_TURN as RUN_ID_OF_TURN,
)
from parley.store.statements.runs import (
    RUN_STATUS as RUN_STATUS,
)
from parley.store.statements.runs import (
    SESSION_OF_TURN as SESSION_OF_TURN,
)
from parley.store.statements.runs import (
    SET_TRACE_CONTEXT as SET_TRACE_CONTEXT,
)
from parley.store.statements.runs import (
    WAKE_DEFERRED as WAKE_DEFERRED,
)
from parley.store.statements.schedules import (
    ALL_SCHEDULES as ALL_SCHEDULES,
)
from parley.store.statements.schedules import (
    DELETE_SCHEDULE as DELETE_SCHEDULE,
)
from parley.store.statements.schedules import (
    DELETE_SCHEDULE_RUNS as DELETE_SCHEDULE_RUNS,
)
from parley.store.statements.schedules import (
    DUE_SCHEDULES as DUE_SCHEDULES,
)
from parley.store.statements.schedules import (
    INSERT_SCHEDULE as INSERT_SCHEDULE,
)
from parley.store.statements.schedules import (
    LOCK_DUE_SCHEDULE as LOCK_DUE_SCHEDULE,
)
from parley.store.statements.schedules import (
    LOCK_SCHEDULE as LOCK_SCHEDULE,
)
from parley.store.statements.schedules import (
    MISSED_SLOT_COUNT as MISSED_SLOT_COUNT,
)
from parley.store.statements.schedules import (
    RUN_STATUS_OF_TURN as RUN_STATUS_OF_TURN,
)
from parley.store.statements.schedules import (
    SCHEDULE as SCHEDULE,
)
from parley.store.statements.schedules import (
    SCHEDULE_COUNTS as SCHEDULE_COUNTS,
)
from parley.store.statements.schedules import (
    SCHEDULE_RUNS as SCHEDULE_RUNS,
)
from parley.store.statements.schedules import (
    SCHEDULES_OF_TENANT as SCHEDULES_OF_TENANT,
)
from parley.store.statements.schedules import (
    UPDATE_SCHEDULE as UPDATE_SCHEDULE,
)
from parley.store.statements.schedules import (
    UPDATE_SLOT as UPDATE_SLOT,
)
from parley.store.statements.seeds import (
    INSERT_SEED as INSERT_SEED,
)
from parley.store.statements.seeds import (
    SEED_OF_SESSION as SEED_OF_SESSION,
)
from parley.store.statements.seeds import (
    SEED_RUN as SEED_RUN,
)
from parley.store.statements.seeds import (
    SEED_TURN as SEED_TURN,
)
from parley.store.statements.seeds import (
    SET_TURN_COUNT as SET_TURN_COUNT,
)
from parley.store.statements.sessions import (
    BUMP_TURN_COUNT as BUMP_TURN_COUNT,
)
from parley.store.statements.sessions import (
    CHARGE_SESSION as CHARGE_SESSION,
)
from parley.store.statements.sessions import (
    CONVERSATIONS_OF_TENANT as CONVERSATIONS_OF_TENANT,
)
from parley.store.statements.sessions import (
    CONVERSATIONS_OF_TENANT_BEFORE as CONVERSATIONS_OF_TENANT_BEFORE,
)
from parley.store.statements.sessions import (
    FINISH_SESSION as FINISH_SESSION,
)
from parley.store.statements.sessions import (
    INSERT_PREFIX as INSERT_PREFIX,
)
from parley.store.statements.sessions import (
    INSERT_SESSION as INSERT_SESSION,
)
from parley.store.statements.sessions import (
    LOCK_SESSION as LOCK_SESSION,
)
from parley.store.statements.sessions import (
    MARK_COMPACTED as MARK_COMPACTED,
)
from parley.store.statements.sessions import (
    MARK_PUSHES as MARK_PUSHES,
)
from parley.store.statements.sessions import (
    PREFIX as PREFIX,
)
from parley.store.statements.sessions import (
    SESSION as SESSION,
)
from parley.store.statements.sessions import (
    SESSIONS_OF_TENANT as SESSIONS_OF_TENANT,
)
from parley.store.statements.sessions import (
    SESSIONS_OF_TENANT_BEFORE as SESSIONS_OF_TENANT_BEFORE,
)
from parley.store.statements.sessions import (
    SESSIONS_WITH_WORK as SESSIONS_WITH_WORK,
)
from parley.store.statements.sessions import (
    SET_GENERATION as SET_GENERATION,
)
from parley.store.statements.sessions import (
    SET_HEAD as SET_HEAD,
)
from parley.store.statements.sessions import (
    SET_TITLE as SET_TITLE,
)
from parley.store.statements.sessions import (
    SET_TITLE_IF_NONE as SET_TITLE_IF_NONE,
)
from parley.store.statements.sessions import (
    TAKE_FENCE as TAKE_FENCE,
)
from parley.store.statements.steers import (
    COUNT_STEER as COUNT_STEER,
)
from parley.store.statements.steers import (
    INSERT_STEER as INSERT_STEER,
)
from parley.store.statements.steers import (
    PENDING_STEERS as PENDING_STEERS,
)
from parley.store.statements.turns import (
    CHILD_OF_TURN as CHILD_OF_TURN,
)
from parley.store.statements.turns import (
    INSERT_TURN as INSERT_TURN,
)
from parley.store.statements.turns import (
    PATH as PATH,
)
from parley.store.statements.turns import (
    PATH_TO_COMPACTION as PATH_TO_COMPACTION,
)
from parley.store.statements.turns import (
    SET_PARENT as SET_PARENT,
)
from parley.store.statements.turns import (
    TREE as TREE,
)
from parley.store.statements.turns import (
    TURN as TURN,
)
from parley.store.statements.turns import (
    TURN_AND_TENANT as TURN_AND_TENANT,
)
from parley.store.statements.turns import (
    TURN_BY_REQUEST as TURN_BY_REQUEST,
)
from parley.store.statements.turns import (
    TURN_COLUMNS as TURN_COLUMNS,
)
from parley.store.statements.turns import (
    TURN_OWNER as TURN_OWNER,
)

"""Pruning ended sessions (docs/operations.md#retention): what
``parley prune``, ``Client.prune`` and the sweeper's expiry run.

The store decides which sessions expire and deletes each one whole, in a transaction of
its own on PostgreSQL and a chunk of them per transaction on SQLite
(:mod:`parley.store.retention`, where "ended" and "newest activity" are defined, and
why a chunk keeps the guarantee).  After each commit this drops the coordinator's keys of
the sessions' turns and, only when asked, removes their workspace directories; and it
drops the acceptances of batches abandoned half-way.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

from parley.batch_acceptance import remove_workspaces
from parley.errors import InvalidRequest
from parley.ports.backend import Coordinator
from parley.schemas.operations import PrunedSession, PruneReport
from parley.store.retention import Candidate, Cut, Deleted
from parley.store.sql_store import SqlStore

log = logging.getLogger("parley.retention")

REMOVED = "removed"
MAX_RETENTION = timedelta(days=365 * 1000)
ABANDONED_AFTER = timedelta(hours=1)
"""A batch's acceptance not finished this long after it began was abandoned (one takes
seconds): a prune drops it."""


def check_retention(value: Any, what: str = "retention") -> timedelta | None:
    """``value`` as a time to live: a positive ``timedelta`` of at least a second (or
    None); :class:`InvalidRequest` for anything else."""
    if value is None:
        return None
    if not isinstance(value, timedelta):
        raise InvalidRequest(
            f"{what} must be a datetime.timedelta (e.g. timedelta(days=30)) or None, "
            f"not {type(value).__name__}"
        )
    if value < timedelta(seconds=1) or value > MAX_RETENTION:
        raise InvalidRequest(f"{what} must be at least a second (and under 1000 years)")
    return value


def days(text: str) -> timedelta:
    """``parley prune --older-than DAYS``: a number of days, 0 or more (fractions too);
    :class:`InvalidRequest` for anything else."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise InvalidRequest(f"--older-than takes a number of days, not {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise InvalidRequest(f"--older-than takes a number of days, 0 or more, not {text!r}")
    if value > MAX_RETENTION.days:
        raise InvalidRequest(f"--older-than takes at most {MAX_RETENTION.days} days")
    return timedelta(days=value)


def prune(
    store: SqlStore,
    coordinator: Coordinator,
    *,
    older_than: timedelta | None,
    default_retention: timedelta | None = None,
    workspaces: bool = False,
    dry_run: bool = False,
) -> PruneReport:
    """Delete every expired ended session, each whole (one per transaction on
    PostgreSQL, a chunk per transaction on SQLite); with ``workspaces``,
    also the workspace directory of each (unless a session left uses it, or it is this
    process's working directory or above, or home, or ``/``).  ``dry_run`` only lists
    them."""
    if older_than is not None and older_than < timedelta(0):
        raise InvalidRequest("older_than must not be negative")
    cut = Cut.of(older_than, default_retention)
    pruned: list[PrunedSession] = []
    became_active = 0
    after: Candidate | None = None
    while True:
        page = store.expired_sessions(cut, after if dry_run else None)
        if not page:
            break
        if dry_run:
            pruned.extend(_listed(store, candidate) for candidate in page)
            after = page[-1]
            continue
        progressed = False
        step = store.sessions_per_prune
        for start in range(0, len(page), step):
            chunk = [candidate.session_id for candidate in page[start : start + step]]
            deleted = store.prune_sessions(chunk, cut, roots=workspaces)
            became_active += len(chunk) - len(deleted)
            progressed = progressed or bool(deleted)
            pruned.extend(_cleaned_up(gone, coordinator, workspaces) for gone in deleted)
        if not progressed:
            # Every one of them turned active meanwhile (they drop out of the next look
            # anyway; this only spares the look).
            break
    # Batches that ended before the cut go with their files (their sessions, ended by
    # then, were pruned above as any are), and so do uploads made before it that no
    # batch was made from.
    batch_cut = cut.older if cut.older is not None else cut.default
    batches = () if batch_cut is None else tuple(store.prune_batches(batch_cut, dry_run=dry_run))
    uploads = () if batch_cut is None else tuple(store.prune_uploads(batch_cut, dry_run=dry_run))
    if not dry_run:
        _drop_abandoned(store, cut)
    return PruneReport(
        pruned=tuple(pruned),
        became_active=became_active,
        awaiting_webhooks=store.awaiting_deliveries(cut),
        batches=batches,
        uploads=uploads,
        dry_run=dry_run,
    )


def _drop_abandoned(store: SqlStore, cut: Cut) -> None:
    """Drop the acceptances of batches begun over :data:`ABANDONED_AFTER` ago and never
    finished (their process died half-way; docs/batches.md): their rows, never seen by a
    reader, and the workspace directories made for them."""
    for acceptance in store.abandoned_acceptances(cut.now - ABANDONED_AFTER):
        roots = store.drop_batch(acceptance.batch_id, seen=acceptance.lines)
        if roots is not None:
            remove_workspaces(roots)
            log.info("dropped batch %s, abandoned while it was accepted", acceptance.batch_id)


def _listed(store: SqlStore, candidate: Candidate) -> PrunedSession:
    return PrunedSession(
        session_id=candidate.session_id,
        root=candidate.root,
        turns=store.turn_count(candidate.session_id),
        last_active_at=candidate.last_active_at,
    )


def _cleaned_up(deleted: Deleted, coordinator: Coordinator, workspaces: bool) -> PrunedSession:
    """After a session's deletion committed: its turns' keys, and its workspace if asked."""
    session = deleted.session
    coordinator.forget(session.session_id, deleted.turn_ids)
    log.info(
        "pruned session %s (%d turns, last active %s)",
        session.session_id,
        session.turns,
        session.last_active_at.isoformat(),
    )
    if not workspaces:
        return session
    outcome = _remove_workspace(session.root, bool(deleted.root_in_use))
    return PrunedSession(
        session_id=session.session_id,
        root=session.root,
        turns=session.turns,
        last_active_at=session.last_active_at,
        workspace=outcome,
    )


def _remove_workspace(root: str, in_use: bool) -> str:
    """Remove a pruned session's workspace; returns ``removed`` or why it stays."""
    if in_use:
        return "kept: another session uses it"
    path = Path(root)
    if not path.exists():
        return "kept: it was gone already"
    if not path.is_dir() or path.is_symlink():
        return "kept: not a directory"
    resolved = path.resolve()
    here = Path.cwd().resolve()
    if resolved == Path(resolved.anchor) or resolved == Path.home().resolve():
        return "kept: it is / or the home directory"
    if resolved == here or resolved in here.parents:
        return "kept: it holds this process's working directory"
    try:
        shutil.rmtree(resolved)
    except OSError as exc:
        return f"kept: {exc.strerror or exc}"
    log.info("removed workspace %s", os.fspath(resolved))
    return REMOVED


def report_lines(report: PruneReport) -> list[str]:
    """What ``parley prune`` prints: a line per session, and a summary."""
    verb = "would prune" if report.dry_run else "pruned"
    lines = []
    for session in report.pruned:
        lines.append(
            f"{verb} session {session.session_id} ({session.turns} turn(s), "
            f"last active {session.last_active_at.isoformat(timespec='seconds')}, "
            f"root {session.root})"
        )
        if session.workspace is not None:
            lines.append(f"  workspace {session.root}: {session.workspace}")
    if report.pruned:
        turns = sum(s.turns for s in report.pruned)
        summary = f"{verb} {len(report.pruned)} session(s), {turns} turn(s)"
        lines.append(summary + (" (dry run: nothing deleted)" if report.dry_run else ""))
    else:
        lines.append("nothing to prune")
    deleted = "would delete" if report.dry_run else "deleted"
    if report.batches:
        lines.append(f"{deleted} {len(report.batches)} ended batch(es) and their files")
    if report.uploads:
        lines.append(f"{deleted} {len(report.uploads)} upload(s) no batch was made from")
    if report.became_active:
        lines.append(
            f"kept {report.became_active} session(s) that got a turn (or were pruned "
            "elsewhere) as they were about to be deleted"
        )
    if report.awaiting_webhooks:
        lines.append(
            f"kept {report.awaiting_webhooks} ended session(s) whose webhooks are not "
            "delivered yet (pruned once delivered or given up)"
        )
    return lines

"""What a route's path names, read once the request's tenant is found to own it: a
session, a turn, a batch or a file of another tenant's (or none) answers as an unknown
one (``404``), before the route's body runs (docs/http.md#1-tokens-and-tenants).

Each is a FastAPI dependency a route declares by its ``Annotated`` alias
(:data:`OwnedSession`, :data:`OwnedTurn`, :data:`StreamedTurn`, :data:`OwnedBatch`,
:data:`OwnedFile`), so no route writes the check out.  They are plain functions: FastAPI
runs them on the thread pool every route shares, as the routes ran them before
(``work.light``); but :data:`StreamedTurn`, which asks the process's feeds first, on the
loop (a turn whose submission started its feed is known there, and read no more)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from parley.batches import batch_of_tenant, file_of_tenant
from parley.gateway.dependencies import ClientDep, FeedsDep, Tenant
from parley.gateway.tenants import owned_session, owned_turn
from parley.gateway.work import light
from parley.schemas.batches import BatchRecord, FileRecord
from parley.schemas.records import SessionRecord, TurnRecord
from parley.telemetry.log_context import bind


def session_of_tenant(session_id: str, client: ClientDep, owner: Tenant) -> SessionRecord:
    """The path's session, if the tenant owns it."""
    return owned_session(client, session_id, owner)


def turn_of_tenant(turn_id: str, client: ClientDep, owner: Tenant) -> TurnRecord:
    """The path's turn, if the tenant owns its session."""
    return owned_turn(client, turn_id, owner)


async def streamed_turn_of_tenant(
    turn_id: str, client: ClientDep, feeds: FeedsDep, owner: Tenant
) -> TurnRecord:
    """The path's turn, if the tenant owns its session: as the submission that started
    the turn's feed knew it (the feed was started for this tenant), else read."""
    record = feeds.owned(turn_id, owner)
    if record is None:
        return await light(owned_turn, client, turn_id, owner)
    bind(session_id=record.session_id, turn_id=turn_id, run_id=record.run_id)
    return record


def batch_of_path(batch_id: str, client: ClientDep, owner: Tenant) -> BatchRecord:
    """The path's batch, if the tenant owns it."""
    return batch_of_tenant(client.runtime, batch_id, owner)


def file_of_path(file_id: str, client: ClientDep, owner: Tenant) -> FileRecord:
    """The path's file, if the tenant owns it."""
    return file_of_tenant(client.runtime, file_id, owner)


OwnedSession = Annotated[SessionRecord, Depends(session_of_tenant)]
"""A route parameter: the session ``{session_id}`` names, the tenant's (else 404)."""

OwnedTurn = Annotated[TurnRecord, Depends(turn_of_tenant)]
"""A route parameter: the turn ``{turn_id}`` names, of the tenant's sessions (else 404)."""

StreamedTurn = Annotated[TurnRecord, Depends(streamed_turn_of_tenant)]
"""A route parameter: the turn ``{turn_id}`` names, of the tenant's sessions (else 404),
for a route that streams it (the feed a submission started answers first)."""

OwnedBatch = Annotated[BatchRecord, Depends(batch_of_path)]
"""A route parameter: the batch ``{batch_id}`` names, the tenant's (else 404)."""

OwnedFile = Annotated[FileRecord, Depends(file_of_path)]
"""A route parameter: the file ``{file_id}`` names, the tenant's (else 404)."""

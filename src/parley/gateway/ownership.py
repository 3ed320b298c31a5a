"""What a route's path names, read once the request's tenant is found to own it: a
session, a turn, a batch or a file of another tenant's (or none) answers as an unknown
one (``404``), before the route's body runs (docs/http.md#1-tokens-and-tenants).

Each is a FastAPI dependency a route declares by its ``Annotated`` alias
(:data:`OwnedSession`, :data:`OwnedTurn`, :data:`OwnedBatch`, :data:`OwnedFile`), so no
route writes the check out.  They are plain functions: FastAPI runs them on the thread
pool every route shares, as the routes ran them before (``work.light``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from parley.batches import batch_of_tenant, file_of_tenant
from parley.gateway.dependencies import ClientDep, Tenant
from parley.gateway.tenants import owned_session, owned_turn
from parley.schemas.batches import BatchRecord, FileRecord
from parley.schemas.records import SessionRecord, TurnRecord


def session_of_tenant(session_id: str, client: ClientDep, owner: Tenant) -> SessionRecord:
    """The path's session, if the tenant owns it."""
    return owned_session(client, session_id, owner)


def turn_of_tenant(turn_id: str, client: ClientDep, owner: Tenant) -> TurnRecord:
    """The path's turn, if the tenant owns its session."""
    return owned_turn(client, turn_id, owner)


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

OwnedBatch = Annotated[BatchRecord, Depends(batch_of_path)]
"""A route parameter: the batch ``{batch_id}`` names, the tenant's (else 404)."""

OwnedFile = Annotated[FileRecord, Depends(file_of_path)]
"""A route parameter: the file ``{file_id}`` names, the tenant's (else 404)."""

"""Sessions named by a protocol's own conversation id (docs/protocols.md): an AG-UI ``threadId``, an
AI SDK chat ``id``.

An id the tenant has not used opens a new session, the same id later continues it, and
another tenant's same id is a session of its own.  No table maps one to the other: the
session id is *derived* from the tenant and the external id (a UUID 5), so every gateway
process finds the same session without a lookup of its own, and a create that races
another one for the same id loses to it harmlessly (``Conflict`` means "exists").  An
external id that is itself a session id the tenant owns names that session, so a
session made natively (or by another protocol) can be continued from any of them.

Every function here blocks on the store: call them from a thread (``asyncio.to_thread``)
in an asynchronous route.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.client import Client
from parley.errors import Conflict, InvalidRequest, SessionNotFound, TurnNotFound
from parley.gateway.tenants import owned_session
from parley.schemas.records import Decision
from parley.session import Session
from parley.store.ids import storable
from parley.validation import MAX_PROMPT_BYTES, MAX_REQUEST_ID, check_text
from parley.workspaces import workspace_root

NAMESPACE = uuid.UUID("5b0c6f0e-93a4-4c53-9d0b-70a1e7a5c1d2")
"""The namespace of every derived session id.  Fixed for good: changing it would orphan
every thread and chat a client has open."""

MAX_EXTERNAL_ID = 256
"""The longest thread or chat id accepted (it is hashed, so only a sanity bound)."""


@dataclass(frozen=True, kw_only=True)
class Thread:
    """The session an external id names, and whether this call created it."""

    session: Session
    created: bool


def check_external_id(external_id: object, what: str = "thread id") -> str:
    """``external_id`` if it can name a thread (a non-empty string of at most
    :data:`MAX_EXTERNAL_ID` characters, no NUL or lone surrogate), else
    :class:`InvalidRequest`."""
    if (
        not isinstance(external_id, str)
        or not external_id
        or len(external_id) > MAX_EXTERNAL_ID
        or not storable(external_id)
    ):
        raise InvalidRequest(
            f"the {what} must be a non-empty string of at most {MAX_EXTERNAL_ID} characters "
            "(UTF-8, no NUL)"
        )
    return external_id


def derived_session_id(tenant: str, external_id: str) -> str:
    """The session id of ``tenant``'s thread ``external_id`` (the same in every process)."""
    return str(uuid.uuid5(NAMESPACE, f"{tenant}\x00{external_id}"))


def find_thread(client: Client, tenant: str, external_id: str) -> Session | None:
    """The session ``tenant``'s ``external_id`` names, or None if it names none yet
    (nothing is created)."""
    check_external_id(external_id)
    for candidate in (external_id, derived_session_id(tenant, external_id)):
        try:
            owned_session(client, candidate, tenant)
        except SessionNotFound:
            continue
        return client.session(candidate)
    return None


def open_thread(
    client: Client,
    workspaces: Path,
    tenant: str,
    external_id: str,
    *,
    metadata: dict[str, Any] | None = None,
    agent: str | None = None,
) -> Thread:
    """The session ``tenant``'s ``external_id`` names, created (with ``metadata``, and a
    workspace named by its id under the tenant's, its turns the declared ``agent``'s if
    given) if there is none yet.

    :class:`SessionNotFound` only if the derived id is taken by another tenant's session,
    which no client can bring about (the id is a hash of the tenant too)."""
    found = find_thread(client, tenant, external_id)
    if found is not None:
        return Thread(session=found, created=False)
    session_id = derived_session_id(tenant, external_id)
    root = workspace_root(workspaces, tenant, session_id)
    try:
        session = client.open_session(
            root, metadata=metadata, tenant=tenant, session_id=session_id, agent=agent
        )
    except Conflict:
        # Another request created it between the look-up and the insert: it is ours to
        # continue (or, if another tenant's, unknown here).
        owned_session(client, session_id, tenant)
        return Thread(session=client.session(session_id), created=False)
    return Thread(session=session, created=True)


@dataclass(frozen=True, kw_only=True)
class ApprovalAnswer:
    """A protocol's answer to a call that waits for a person (docs/approvals.md)."""

    approval_id: str
    approved: bool
    reason: str | None = None


def answer_approvals(client: Client, session: Session, answers: Sequence[ApprovalAnswer]) -> str:
    """Answer calls that a turn of ``session`` waits on (an AG-UI ``resume``, the AI SDK's
    approval responses); the turn's id.  An answer given already is taken again as it was
    (a retried request).  :class:`TurnNotFound` if no turn of the session asked them
    all, :class:`Conflict` if one has another answer already: either way nothing is
    answered."""
    if not answers:
        raise InvalidRequest("no approval to answer")
    ids = {answer.approval_id for answer in answers}
    for turn in reversed(session.tree()):
        asked = {a.approval_id: a for a in client.approvals_of(turn.turn_id)}
        if ids <= asked.keys():
            break
    else:
        raise TurnNotFound(f"no turn of this thread asked about {sorted(ids)}")
    fresh = []
    for answer in answers:
        given = asked[answer.approval_id]
        if given.pending:
            fresh.append(answer)
        elif (given.decision is Decision.APPROVED) != answer.approved:
            raise Conflict(f"call {given.approval_id!r} was {given.decision} already")
    handle = client.attach(turn.turn_id)
    for answer in fresh:
        if answer.approved:
            handle.approve(answer.approval_id)
        else:
            handle.deny(answer.approval_id, answer.reason)
    return turn.turn_id


def check_prompt(text: str) -> str:
    """``text`` if a turn may have it as its prompt (the checks ``Session.submit`` makes,
    made before anything is created), else :class:`InvalidRequest`."""
    return check_text(text, "prompt", MAX_PROMPT_BYTES)


def message_request_id(protocol: str, message_id: str, text: str) -> str:
    """The ``request_id`` of the turn a client's message ``message_id`` (with ``text``)
    asks for: the same message sent again (a retried request, a run with no newer user
    message) answers the turn it made instead of making a second one, and a message
    edited under the same id (the AI SDK keeps it) makes a new one.

    :class:`InvalidRequest` for a message id no store keeps (a NUL, a lone surrogate):
    call this before anything is created for the request."""
    if not storable(message_id):
        raise InvalidRequest("the message id must be UTF-8 text without NUL characters")
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    request_id = f"{protocol}:{message_id}:{digest}"
    if len(request_id) > MAX_REQUEST_ID:
        whole = hashlib.sha256(f"{message_id}\x00{text}".encode("utf-8", "surrogatepass"))
        request_id = f"{protocol}:sha256:{whole.hexdigest()}"
    return request_id


__all__ = [
    "MAX_EXTERNAL_ID",
    "NAMESPACE",
    "ApprovalAnswer",
    "Thread",
    "answer_approvals",
    "check_external_id",
    "check_prompt",
    "derived_session_id",
    "find_thread",
    "message_request_id",
    "open_thread",
]

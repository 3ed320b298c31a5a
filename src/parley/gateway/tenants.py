"""Bearer tokens and the tenants they name (docs/http.md#1-tokens-and-tenants).

A token is compared with every configured one in constant time (``hmac.compare_digest``
on each, no early exit), so the time a refusal takes says nothing about how much of a
token was right.  Tokens never reach a log: nothing here logs, and the access log omits
query strings (the page's URL carries one).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from parley.client import Client
from parley.errors import InvalidRequest, SessionNotFound, TurnNotFound
from parley.schemas.records import SessionRecord, TurnRecord
from parley.store.ids import validate_ids
from parley.telemetry.log_context import bind


class TokenTable:
    """Which tenant a presented token names, if any."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        self._pairs = [(token.encode(), tenant) for token, tenant in tokens.items()]

    def tenant_of(self, presented: str) -> str | None:
        """The tenant of ``presented``, or None; the time taken depends only on the
        number of tokens and their lengths."""
        given = presented.encode("utf-8", "surrogateescape")
        found = None
        for token, tenant in self._pairs:
            if hmac.compare_digest(token, given):
                found = tenant
        return found


def owned_session(client: Client, session_id: str, owner: str) -> SessionRecord:
    """The session if ``owner`` owns it; another tenant's answers as an unknown one."""
    if not plausible_id(session_id):
        raise SessionNotFound(f"no session {session_id!r}")
    record = client.session_record(session_id)
    if record.tenant != owner:
        raise SessionNotFound(f"no session {session_id!r}")
    bind(session_id=session_id)  # (the request's log lines are about it from here on)
    return record


def owned_turn(client: Client, turn_id: str, owner: str) -> TurnRecord:
    """The turn if ``owner`` owns its session; another tenant's answers as an unknown one."""
    if not plausible_id(turn_id):
        raise TurnNotFound(f"no turn {turn_id!r}")
    turn, tenant = client.turn_and_tenant(turn_id)
    if tenant != owner:
        raise TurnNotFound(f"no turn {turn_id!r}")
    bind(session_id=turn.session_id, turn_id=turn_id, run_id=turn.run_id)
    return turn


def plausible_id(value: str) -> bool:
    """Whether ``value`` could be a parley id at all (else it is unknown, without a query)."""
    try:
        validate_ids(value)
    except InvalidRequest:
        return False
    return True

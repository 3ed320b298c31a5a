"""Statements on compactions (docs/compaction.md): insert one, list a session's, drop
one, and note the ``compacted`` event of one made between turns on its head's run."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, insert, or_, select, update

from parley.schemas import tables as t
from parley.store.statements.binds import b

_c = t.compactions

ANY_NATIVE = "*"
"""``native_of`` for a read that takes every provider's native compaction as one that
can apply (a claim's: the engine reads again for a model of another provider)."""


def usable_by(native_of: Any) -> Any:
    """Whether a compaction can apply to a request to the provider ``native_of`` names
    (:data:`ANY_NATIVE`: any; ``""``: none takes a native one): every one that is not
    native, and the native ones of that provider."""
    return or_(
        _c.c.native_provider.is_(None),
        native_of == ANY_NATIVE,
        _c.c.native_provider == native_of,
    )


COMPACTIONS_OF_SESSION = (
    select(_c).where(_c.c.session_id == b("session_id")).order_by(_c.c.created_at, _c.c.id)
)
# How many a session has, dropped ones too: a compaction on request counts them when it
# reads the path, and is stored only if none was made since (two asked at once).
COUNT_COMPACTIONS_OF_SESSION = (
    select(func.count()).select_from(_c).where(_c.c.session_id == b("session_id"))
)

COMPACTION = select(_c).where(_c.c.id == b("compaction_id"))

# The live ones covering through any of the given turns (a claim checking a path it
# knows), and the one that applies of those covering through one turn: the newest, the
# first made among equals (parley.schemas.compactions.applicable).
LIVE_COMPACTIONS_THROUGH = select(_c).where(
    _c.c.through_turn_id.in_(b("turn_ids", expanding=True)), _c.c.dropped_at.is_(None)
)
LIVE_COMPACTION_THROUGH = (
    select(_c)
    .where(
        _c.c.through_turn_id == b("turn_id"),
        _c.c.dropped_at.is_(None),
        usable_by(b("native_of")),
    )
    .order_by(_c.c.created_at.desc(), _c.c.id)
    .limit(1)
)

INSERT_COMPACTION = insert(_c).values(
    id=b("compaction_id"),
    session_id=b("session_id"),
    through_turn_id=b("through_turn_id"),
    made_by_turn_id=b("made_by_turn_id"),
    strategy=b("strategy"),
    text=b("text"),
    messages=b("messages", type_=_c.c.messages.type),
    tokens_before=b("tokens_before"),
    tokens_after=b("tokens_after"),
    usage=b("usage", type_=_c.c.usage.type),
    native_provider=b("native_provider"),
    native_item=b("native_item", type_=_c.c.native_item.type),
    created_at=b("now"),
)

DROP_COMPACTION = (
    update(_c)
    .where(
        _c.c.id == b("compaction_id"),
        _c.c.session_id == b("session_id"),
        _c.c.dropped_at.is_(None),
    )
    .values(dropped_at=b("now"))
)

# A compaction made between turns announces itself on the head's run, after its end.
NOTE_EVENT_ON_RUN = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.last_seq < b("seq"))
    .values(last_seq=b("seq"))
)

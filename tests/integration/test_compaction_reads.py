"""What a claim reads of a compacted session (docs/compaction.md#which-one-applies): the
path only back to the compaction that applies, with it, so a long session's request
costs what its compacted form costs; a branch from before the compaction reads the whole
path; a dropped one is walked past; a path a turn's end knew is checked against the
compactions made or dropped since; and the hooks still see the whole path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import parley
from parley.schemas.compactions import (
    CompactionDraft,
    CompactionRecord,
    CompactionStrategy,
    NativeItem,
)
from parley.schemas.records import TurnRecord
from parley.store.compactions import known_compacted_path, read_compacted_path
from parley.store.statements.compactions import ANY_NATIVE
from tests.support.waiting import wait_until

RULES = {"rules": [{"when": ".*", "steps": [{"text": "heard: {prompt}"}]}]}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db.sqlite'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def claim_read(
    client: parley.Client, head: str, native_of: str = ANY_NATIVE
) -> tuple[CompactionRecord | None, list[str]]:
    """What a claim of a turn hung under ``head`` reads (for a model reading the native
    items of ``native_of``): the compaction, the turn ids."""
    found, path = client.store.db.reading(lambda db: read_compacted_path(db, head, native_of))
    return found, [t.turn_id for t in path]


def known_read(
    client: parley.Client, start: CompactionRecord | None, known: list[TurnRecord]
) -> tuple[CompactionRecord | None, list[str]] | None:
    found = client.store.db.reading(lambda db: known_compacted_path(db, start, known))
    return None if found is None else (found[0], [t.turn_id for t in found[1]])


def id_of(record: CompactionRecord | None) -> str | None:
    return None if record is None else record.compaction_id


def test_a_claim_reads_the_path_only_back_to_the_compaction_that_applies(
    db: str, tmp_path: Path
) -> None:
    host = parley.Host(model=parley.models.ScriptedModel(RULES))
    with parley.connect(db, host=host) as client:
        session = client.open_session(str(tmp_path))
        for n in range(6):
            session.turn(f"turn {n}")
        ids = [t.turn_id for t in session.history()]
        assert claim_read(client, ids[-1]) == (None, ids)  # none: the whole path

        older = session.compact(strategy="trim", keep_turns=4)  # through ids[1]
        newer = session.compact(strategy="trim", keep_turns=2)  # through ids[3]
        found, path = claim_read(client, ids[-1])
        assert id_of(found) == newer.compaction_id and path == ids[4:]
        # Under a covered turn the older one is the furthest along the path.
        found, path = claim_read(client, ids[2])
        assert id_of(found) == older.compaction_id and path == ids[2:3]
        # A branch from before both reads its whole path and sees neither.
        assert claim_read(client, ids[0]) == (None, ids[:1])

        # A dropped one is walked past, back to the one before it (then to the root).
        client.store.drop_compaction(session.id, newer.compaction_id)
        found, path = claim_read(client, ids[-1])
        assert id_of(found) == older.compaction_id and path == ids[2:]
        client.store.drop_compaction(session.id, older.compaction_id)
        assert claim_read(client, ids[-1]) == (None, ids)


def test_a_known_path_is_checked_against_the_compactions_made_and_dropped_since(
    db: str, tmp_path: Path
) -> None:
    host = parley.Host(model=parley.models.ScriptedModel(RULES))
    with parley.connect(db, host=host) as client:
        session = client.open_session(str(tmp_path))
        for n in range(6):
            session.turn(f"turn {n}")
        turns = session.history()
        ids = [t.turn_id for t in turns]
        assert known_read(client, None, turns) == (None, ids)

        older = session.compact(strategy="trim", keep_turns=4)  # through ids[1]
        # Known from the root: the one made since on it applies.
        found = known_read(client, None, turns)
        assert found is not None and id_of(found[0]) == older.compaction_id
        assert found[1] == ids[2:]
        # Known after it, and it still applies.
        found = known_read(client, older, turns[2:])
        assert found is not None and id_of(found[0]) == older.compaction_id
        assert found[1] == ids[2:]
        newer = session.compact(strategy="trim", keep_turns=1)  # through ids[4]
        found = known_read(client, older, turns[2:])
        assert found is not None and id_of(found[0]) == newer.compaction_id
        assert found[1] == ids[5:]
        # The one it was known after dropped, none made since on it: read it again.
        client.store.drop_compaction(session.id, newer.compaction_id)
        client.store.drop_compaction(session.id, older.compaction_id)
        assert known_read(client, older, turns[2:]) is None


def test_a_native_compaction_is_read_only_for_its_provider(db: str, tmp_path: Path) -> None:
    host = parley.Host(model=parley.models.ScriptedModel(RULES))
    with parley.connect(db, host=host) as client:
        session = client.open_session(str(tmp_path))
        for n in range(5):
            session.turn(f"turn {n}")
        ids = [t.turn_id for t in session.history()]
        older = session.compact(strategy="trim", keep_turns=4)  # through ids[0]
        draft = CompactionDraft(
            session_id=session.id,
            through_turn_id=ids[2],
            strategy=CompactionStrategy.NATIVE,
            text="the provider's summary",
            messages=(),
            tokens_before=100,
            tokens_after=10,
            native=NativeItem(provider="anthropic", item={"type": "compaction", "content": "s"}),
        )
        native, _ = client.store.add_compaction(draft, head=ids[-1])
        assert native.native == draft.native  # stored as it came
        # A claim stops at it, and so does a read for its provider.
        for reader in (ANY_NATIVE, "anthropic"):
            found, path = claim_read(client, ids[-1], reader)
            assert id_of(found) == native.compaction_id and path == ids[3:]
            assert found is not None and found.native == draft.native
        # Another provider's model, or one that reads none, walks past it.
        for reader in ("openai", ""):
            found, path = claim_read(client, ids[-1], reader)
            assert id_of(found) == older.compaction_id and path == ids[1:]


def test_the_hooks_see_the_whole_path_past_a_compaction(db: str, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    class Hooks(parley.SessionHooks):
        def before_turn(
            self,
            request: parley.TurnRequest,
            options: parley.TurnOptions,
            state: parley.SessionStateView,
        ) -> None:
            # (this session's only: on the run's shared PostgreSQL database the client
            # may also go on with a turn another test left there)
            if state.session.session_id == seen.get("session"):
                seen["history"] = [t.turn_id for t in state.history]

        def after_commit(self, receipt: parley.CommitReceipt) -> None:
            if receipt.outcome.session_id == seen.get("session"):
                seen["path"] = receipt.path

    host = parley.Host(model=parley.models.ScriptedModel(RULES), hooks=Hooks())
    with parley.connect(db, host=host) as client:
        session = client.open_session(str(tmp_path))
        seen["session"] = session.id
        for n in range(4):
            session.turn(f"turn {n}")
        ids = [t.turn_id for t in session.history()]
        session.compact(strategy="trim", keep_turns=1)
        result = session.turn("past the compaction")
        assert seen["history"] == ids
        # (after_commit runs once the end is committed, beside the turn's waiters)
        wait_until(lambda: seen["path"][-1] == result.turn_id, 10, "the last turn's after_commit")
        assert seen["path"] == (*ids, result.turn_id)

"""Whatever a session goes through (turns with tool rounds, compactions of either
strategy and any reach, drops, branches), every request the model is sent is a checked
replay (docs/guarantees.md#11-checked-replay): the messages of the compaction that
applies to the turn's path, then the turns after it whole, then the turn itself; and
the tree holds every turn (docs/compaction.md#which-one-applies)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import parley
from parley.engine.context import check_replay, turn_replay
from parley.errors import Conflict
from parley.schemas.compactions import applicable
from parley.schemas.messages import Message
from tests.support.helpers import RecordingModel


@parley.tool
def fetch(page: int) -> str:
    """Fetch a page.

    Args:
        page: which page.
    """
    return f"page {page}: " + "q" * 300


RULES = [
    {"when": "^USER: ", "steps": [{"text": "## Goal\nfetch\n## Next steps\nmore"}]},
    {
        "when": "^fetch",
        "steps": [
            {"text": "", "tool_calls": [{"name": "fetch", "arguments": {"page": 1}}]},
            {"text": "", "tool_calls": [{"name": "fetch", "arguments": {"page": 2}}]},
            {"text": "fetched"},
        ],
    },
    {"when": ".*", "steps": [{"text": "ok"}]},
]

Op = tuple[str, int]
OPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["fetch", "say"]), st.just(0)),
        st.tuples(st.sampled_from(["trim", "summarize"]), st.integers(0, 3)),
        st.tuples(st.sampled_from(["drop", "branch"]), st.integers(0, 50)),
    ),
    min_size=1,
    max_size=12,
)


def expected_history(session: parley.Session, client: parley.Client) -> tuple[Message, ...]:
    """What the next turn's request must start with, from the store alone."""
    path = session.history()
    ids = [t.turn_id for t in path]
    record = applicable(session.compactions(), ids)
    start = 0 if record is None else ids.index(record.through_turn_id) + 1
    messages: list[Message] = list(record.messages) if record is not None else []
    for turn in path[start:]:
        messages.extend(turn_replay(turn.prompt, client.store.steps_of(turn.turn_id)))
    return tuple(messages)


def apply(op: Op, session: parley.Session, client: parley.Client, model: RecordingModel) -> None:
    kind, n = op
    if kind in ("fetch", "say"):
        expected = expected_history(session, client)
        before = len(model.requests)
        result = session.turn(f"{kind} now")
        assert result.outcome is parley.TurnStatus.FINISHED
        for request in model.requests[before:]:
            check_replay(request.messages)
            assert request.messages[: len(expected)] == expected
    elif kind in ("trim", "summarize"):
        try:
            session.compact(strategy=kind, keep_turns=n, keep=1)
        except Conflict:
            # Nothing to compact: too few turns, or the turns it would cover are the ones
            # the compaction that applies covers already.
            path = [t.turn_id for t in session.history()]
            if len(path) > n:
                covering = applicable(session.compactions(), path[: len(path) - n])
                assert covering is not None
                assert covering.through_turn_id == path[len(path) - n - 1]
    elif kind == "drop":
        made = session.compactions()
        if made:
            session.drop_compaction(made[n % len(made)].compaction_id)
    else:
        tree = session.tree()
        if tree:
            session.branch_from(tree[n % len(tree)].turn_id)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
# A trim, a summary chained on it, a drop, a branch from before it: each then a turn.
@example(ops=[("fetch", 0), ("fetch", 0), ("trim", 0), ("fetch", 0)])
@example(ops=[("fetch", 0), ("fetch", 0), ("trim", 1), ("summarize", 0), ("say", 0)])
@example(ops=[("fetch", 0), ("fetch", 0), ("summarize", 1), ("drop", 0), ("fetch", 0)])
@example(ops=[("fetch", 0), ("fetch", 0), ("trim", 0), ("branch", 0), ("fetch", 0)])
def test_every_request_is_the_compaction_that_applies_then_the_turns_after_it(
    ops: list[Op], tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("compaction")
    model = RecordingModel(parley.models.ScriptedModel({"rules": RULES}))
    host = parley.Host(model=model, tools=[fetch])
    with parley.connect(f"sqlite:///{root / 'db.sqlite'}", host=host) as client:
        session = client.open_session(str(root))
        turns = 0
        for op in ops:
            apply(op, session, client, model)
            turns += op[0] in ("fetch", "say")
        assert len(session.tree()) == turns  # every turn is still stored

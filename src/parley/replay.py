"""``client.replay``: a recorded session's turns re-run in a new session marked
``replay_of``, against another model, system prompt or host (docs/replay.md).

The replay session is an ordinary session: its turns are the original's prompts, queued
in order, each carrying the original turn's id in its host context so that the engine
places that turn's steers where they entered, and, in ``recorded`` mode, answers every
call the original made with its recorded result (:mod:`parley.replay_tools`).  Nothing of
the original is written."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parley import replay_report
from parley.batch_acceptance import Accepted
from parley.batches import BATCH_ID, PAGE, Batch, new_batch_id, new_file_id, start_lines
from parley.errors import BatchNotFound, InvalidRequest
from parley.host import Host
from parley.openai_api.batch_objects import COMPLETION_WINDOW
from parley.replay_tools import REPLAY_KEY, LocalChoice, remember
from parley.schemas.batches import Endpoint
from parley.schemas.records import REPLAY_TURN_KEY, SessionRecord, TurnRecord, TurnResult
from parley.session import Session
from parley.store.batch_acceptance import NewBatch
from parley.transcript import AssistantRow, InputRow, PromptRow, Row, ToolResultRow
from parley.turn_handle import TurnHandle
from parley.validation import check_id

if TYPE_CHECKING:
    from parley.client_runtime import Runtime

TOOLS_MODES = ("recorded", "live")
Scorer = Callable[[str, str], float]


@dataclass(frozen=True)
class Replay:
    """A replay under way: its new session, the original's turns and the replay's."""

    runtime: Runtime
    session_id: str
    original_id: str
    pairs: tuple[tuple[TurnRecord, TurnHandle], ...]

    def wait(self, timeout: float | None = None) -> list[TurnResult]:
        """Block until every replayed turn ended (``timeout``: seconds for them all)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        results = []
        for _original, handle in self.pairs:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            results.append(handle.wait(left))
        return results

    def report(self, *, scorer: Scorer | Any = None) -> dict[str, Any]:
        """The original and the replay compared turn by turn (docs/replay.md#the-report);
        ``scorer`` is a function of (original reply, replay reply) to a number, or a model
        asked to judge them."""
        return replay_report.report(
            self.runtime.store,
            self.original_id,
            self.session_id,
            [(o.turn_id, h.turn_id) for o, h in self.pairs],
            scorer=scorer,
        )


def start_replay(
    runtime: Runtime,
    session_id: str,
    *,
    host: Host | None = None,
    model: Any = None,
    system_prompt: str | None = None,
    from_turn: int | str | None = None,
    tools: str = "recorded",
    priority: str = "interactive",
) -> Replay:
    """Open the replay session and queue its turns (see :meth:`parley.Client.replay`)."""
    check_id(session_id)
    _check_choices(runtime, host, model, system_prompt, tools)
    runtime.check_open()
    runtime.ready()
    store = runtime.store
    original = store.get_session(session_id)
    history = store.history(session_id)
    start = _first_turn(history, from_turn)
    record = store.create_replay_session(original, _metadata(original, model, system_prompt, tools))
    return _queued(runtime, record, history, start, _local(host, model), priority)


def _metadata(
    original: SessionRecord, model: Any, system_prompt: str | None, tools: str
) -> dict[str, Any]:
    """The replay session's metadata: the original's, and what the replay chose."""
    chosen = {
        "tools": tools,
        "model": model if isinstance(model, str) else None,
        "system_prompt": system_prompt,
    }
    return {**original.metadata, REPLAY_KEY: chosen}


def _local(host: Host | None, model: Any) -> LocalChoice | None:
    """What this process must hold for the replay's turns (Python objects), if anything."""
    if host is None and (model is None or isinstance(model, str)):
        return None
    return LocalChoice(model=None if isinstance(model, str) else model, host=host)


def _queued(
    runtime: Runtime,
    record: SessionRecord,
    history: Sequence[TurnRecord],
    start: int,
    local: LocalChoice | None,
    priority: str,
) -> Replay:
    """Queue the turns of ``history`` from ``start`` in the replay session ``record``,
    the ones before it seeded as its history."""
    if local is not None:
        remember(record.session_id, local)
    session = Session(runtime, record)
    if start:
        session.seed_history(_openai_messages(_rows(runtime.store, history[:start])))
    pairs = tuple(
        (
            turn,
            session.submit(turn.prompt, context={REPLAY_TURN_KEY: turn.turn_id}, priority=priority),
        )
        for turn in history[start:]
    )
    assert record.replay_of is not None
    return Replay(runtime, record.session_id, record.replay_of, pairs)


def _check_choices(
    runtime: Runtime, host: Host | None, model: Any, system_prompt: str | None, tools: str
) -> None:
    if tools not in TOOLS_MODES:
        raise InvalidRequest(f"tools must be 'recorded' or 'live', not {tools!r}")
    if host is not None and not isinstance(host, Host):
        raise InvalidRequest(f"host must be a parley.Host, not {type(host).__name__}")
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise InvalidRequest("system_prompt must be text or None")
    if (
        model is not None
        and not isinstance(model, str)
        and not callable(getattr(model, "stream", None))
    ):
        raise InvalidRequest("model must be a model's name (as PARLEY_MODEL names one) or a model")
    if isinstance(model, str) and not model.strip():
        raise InvalidRequest("model must not be empty")
    if runtime.fleet and (host is not None or (model is not None and not isinstance(model, str))):
        raise InvalidRequest(
            "on a fleet the workers hold the host: name the model as PARLEY_MODEL does "
            "(model='openai:gpt-4o-mini'), not as a Python object"
        )


def _first_turn(history: Sequence[TurnRecord], from_turn: int | str | None) -> int:
    """The index in ``history`` of the first turn to replay."""
    if from_turn is None:
        return 0
    if isinstance(from_turn, int) and not isinstance(from_turn, bool):
        if not 0 <= from_turn < len(history):
            raise InvalidRequest(
                f"from_turn {from_turn} is not a turn of the session (0..{len(history) - 1})"
            )
        return from_turn
    for index, turn in enumerate(history):
        if turn.turn_id == from_turn:
            return index
    raise InvalidRequest(f"from_turn {from_turn!r} is not a turn on the session's history path")


def _rows(store: Any, turns: Sequence[TurnRecord]) -> list[Row]:
    from parley import transcript

    found: list[Row] = []
    for turn in turns:
        found.extend(transcript.rows(turn.turn_id, turn.prompt, store.steps_of(turn.turn_id)))
    return found


def _openai_messages(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The turns before ``from_turn`` as chat messages, seeded as the replay's history."""
    messages: list[dict[str, Any]] = []
    for row in rows:
        if isinstance(row, PromptRow | InputRow):
            messages.append({"role": "user", "content": row.text})
        elif isinstance(row, AssistantRow):
            message: dict[str, Any] = {"role": "assistant", "content": row.text}
            if row.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in row.tool_calls
                ]
            messages.append(message)
        elif isinstance(row, ToolResultRow):
            messages.append({"role": "tool", "tool_call_id": row.call_id, "content": row.content})
    return messages


@dataclass(frozen=True)
class ReplayMany:
    """Many replays at once as one batch (docs/replay.md#many): a line per session
    replayed, its turns in the ``batch`` lane."""

    replays: tuple[Replay, ...]
    batch: Batch

    @property
    def batch_id(self) -> str:
        """The batch's id (``client.batch(id)``, ``GET /v1/batches/{id}``, ``parley batch``)."""
        return self.batch.id

    def progress(self) -> dict[str, int]:
        """How many replayed turns there are, and how many have ended, by outcome."""
        counts: dict[str, int] = {"sessions": len(self.replays), "turns": 0, "ended": 0}
        for replay in self.replays:
            for _original, handle in replay.pairs:
                counts["turns"] += 1
                outcome = handle.record().outcome
                if outcome is not None:
                    counts["ended"] += 1
                    counts[str(outcome)] = counts.get(str(outcome), 0) + 1
        return counts

    def wait(self, timeout: float | None = None) -> None:
        """Block until every replayed turn of every replay ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for replay in self.replays:
            replay.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def report(self, *, scorer: Scorer | Any = None) -> dict[str, Any]:
        """Every replay's report, under ``sessions``, and their ``totals`` summed; with
        the ``batch``'s id."""
        judge = replay_report.scorer_of(scorer)  # (a model's name resolved once)
        reports = [r.report(scorer=judge) for r in self.replays]
        return {
            "batch": self.batch.id,
            "totals": replay_report.sum_totals(reports),
            "sessions": reports,
        }


def start_many(runtime: Runtime, session_ids: Sequence[str], **choices: Any) -> ReplayMany:
    """Replay each of ``session_ids`` as one batch, a line per session (all checked
    first: an unknown session, one with no turn to replay, or a bad choice starts
    none)."""
    if isinstance(session_ids, str) or not isinstance(session_ids, Sequence) or not session_ids:
        raise InvalidRequest("session ids must be a non-empty list of session ids")
    unknown = set(choices) - {"host", "model", "system_prompt", "from_turn", "tools"}
    if unknown:
        raise InvalidRequest(f"replay_many takes no {sorted(unknown)}")
    host, model = choices.get("host"), choices.get("model")
    system_prompt, tools = choices.get("system_prompt"), choices.get("tools", "recorded")
    _check_choices(runtime, host, model, system_prompt, tools)
    for session_id in session_ids:
        check_id(session_id)
    repeated = sorted({s for s in session_ids if session_ids.count(s) > 1})
    if repeated:
        raise InvalidRequest(f"each session is replayed once: {repeated} listed twice")
    runtime.check_open()
    runtime.ready()
    store = runtime.store
    planned = []
    for session_id in session_ids:
        original = store.get_session(session_id)
        history = store.history(session_id)
        start = _first_turn(history, choices.get("from_turn"))
        if start >= len(history):
            raise InvalidRequest(f"session {session_id} has no turn to replay")
        planned.append((original, history, start))
    tenants = {original.tenant for original, _h, _s in planned}
    if len(tenants) > 1:
        raise InvalidRequest("the sessions of one replay batch must be one tenant's")
    return _as_batch(runtime, planned, (host, model, system_prompt, tools))


def _as_batch(
    runtime: Runtime,
    planned: Sequence[tuple[SessionRecord, Sequence[TurnRecord], int]],
    choices: tuple[Host | None, Any, str | None, str],
) -> ReplayMany:
    """The batch of the planned replays: opened, a line (and its replay session) per
    session, each session's turns queued, made whole, then started."""
    host, model, system_prompt, tools = choices
    store = runtime.store
    batch_id = new_batch_id()
    opened = store.open_batch(
        NewBatch(
            batch_id=batch_id,
            tenant=planned[0][0].tenant,
            input_file_id=None,
            output_file_id=new_file_id(),
            error_file_id=new_file_id(),
            endpoint=Endpoint.RESPONSES.value,
            completion_window=COMPLETION_WINDOW,
            metadata={REPLAY_KEY: "true", "model": model if isinstance(model, str) else ""},
            request_id=None,
        )
    )
    assert opened is None  # (a new id, and no request id: always a new batch)
    replays: list[Replay] = []
    try:
        for line, (original, history, start) in enumerate(planned, 1):
            metadata = _metadata(original, model, system_prompt, tools)
            record = store.open_replay_line(batch_id, line, original, metadata)
            replays.append(_queued(runtime, record, history, start, _local(host, model), "batch"))
        last = {line: r.pairs[-1][1].turn_id for line, r in enumerate(replays, 1)}
        finished = store.finish_replay_batch(batch_id, last)
    except BaseException:
        # Its sessions go with it; their roots are the originals' (nothing to remove).
        store.drop_batch(batch_id)
        raise
    start_lines(
        runtime,
        Accepted(record=finished, created=True, opened=tuple(r.session_id for r in replays)),
    )
    return ReplayMany(tuple(replays), Batch(runtime, batch_id))


def replays_of_batch(runtime: Runtime, batch_id: str) -> ReplayMany:
    """The replay batch ``batch_id`` (docs/replay.md#many) read back from its lines:
    each line's original session, its replay session, and each replayed turn with the
    original turn it replays.  :class:`InvalidRequest` for a batch that is no replay's."""
    if not isinstance(batch_id, str) or not BATCH_ID.fullmatch(batch_id):
        raise BatchNotFound(f"no batch {batch_id!r}")
    store = runtime.store
    record = store.get_batch(batch_id)
    # Made by replay_many alone: no input file (a batch made over HTTP has one, and its
    # metadata, the tenant's, may say anything).
    if (record.metadata or {}).get(REPLAY_KEY) != "true" or record.input_file_id is not None:
        raise InvalidRequest(f"batch {batch_id} is not a replay batch (client.replay_many)")
    replays = []
    after = 0
    while page := store.batch_lines(batch_id, None, after, PAGE):
        for line in page:
            if line.session_id is None or line.custom_id is None:
                continue
            pairs = []
            for turn in store.history(line.session_id):
                of_turn = store.run_state(turn.turn_id).host_context.get(REPLAY_TURN_KEY)
                if isinstance(of_turn, str):  # (a seeded turn replays none)
                    pairs.append((store.get_turn(of_turn), TurnHandle(runtime, turn)))
            replays.append(Replay(runtime, line.session_id, line.custom_id, tuple(pairs)))
        after = page[-1].line
    return ReplayMany(tuple(replays), Batch(runtime, batch_id))

"""The OpenAI Responses projection (``parley.gateway.projections.responses``; its objects
in ``parley.openai_api.response_objects``), checked with the official ``openai`` package
and against the Open Responses specification's schema (``tests/support/open_responses.py``):
every event validates against both, the client's own stream accumulator takes the stream
and ends with the reply, and a restarted step leaves the client holding its text once."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import OpenAI, Stream, omit
from openai.lib.streaming.responses import ResponseStream
from openai.types.responses import ParsedResponse, Response, ResponseStreamEvent
from pydantic import TypeAdapter

import parley
from parley.gateway.projection import Projection
from parley.gateway.projections.responses import ResponsesProjection
from parley.openai_api.response_objects import (
    SLOTS,
    ResponseContent,
    ResponseMeta,
    committed_output,
    message_id,
    message_item,
    meta_of,
    response_object,
    stored_response,
)
from parley.ports.backend import CommittedStep
from parley.schemas.events import (
    Ended,
    Event,
    EventPayload,
    Queued,
    Started,
    StepCommitted,
    StepRestarted,
    Token,
    ToolAnswered,
    ToolCalled,
)
from parley.schemas.messages import StepPayload, ToolCall, ToolResult
from parley.schemas.records import TurnStatus
from tests.support.helpers import scripted_host
from tests.support.open_responses import OPENAI_ITEMS, check_event, check_response

TURN = "0b6c0c3e-4a1f-4d55-9d1e-2f9d5d1f7a10"
META = ResponseMeta(response_id=TURN, created_at=1_700_000_000, conversation_id="s-1")
EVENTS = TypeAdapter(ResponseStreamEvent)
RESPONSE = TypeAdapter(Response)


def project(events: list[Event], final: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The whole stream of ``events`` (the last ``end`` closing the response with
    ``final``)."""
    projection = ResponsesProjection(META)
    out: list[dict[str, Any]] = []
    for event in events:
        last = event is events[-1]
        out.extend(projection.project(event, final=final if last else None))
    return out


def validate(stream: list[dict[str, Any]]) -> None:
    """Each event of ``stream`` validated against the official client's model and against
    the specification's schema (but for an event of an item only OpenAI defines)."""
    for event in stream:
        EVENTS.validate_python(event)
        if event.get("item", {}).get("type") not in OPENAI_ITEMS:
            check_event(event)


def parse(stream: list[dict[str, Any]]) -> ParsedResponse[None]:
    """What the official client makes of ``stream``: each event validated, then the SSE
    bytes through ``openai.Stream`` and the ``responses.stream()`` accumulator, to its
    final response."""
    validate(stream)
    body = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in stream).encode()
    request = httpx2.Request("GET", "http://gateway/v1/responses/x")
    response = httpx2.Response(
        200, content=body, request=request, headers={"content-type": "text/event-stream"}
    )
    client = OpenAI(api_key="token-for-a-test", base_url="http://gateway/v1")
    raw: Stream[Any] = Stream(cast_to=ResponseStreamEvent, response=response, client=client)  # type: ignore[arg-type]
    accumulated = ResponseStream(
        raw_stream=raw, text_format=omit, input_tools=omit, starting_after=None
    )
    return accumulated.get_final_response()


def deltas(stream: list[dict[str, Any]]) -> str:
    """What a client that prints every text delta has printed."""
    return "".join(e["delta"] for e in stream if e["type"] == "response.output_text.delta")


def numbered(payloads: list[EventPayload]) -> list[Event]:
    return [Event.of(TURN, seq, p) for seq, p in enumerate(payloads, 1)]


def final_object(status: str, output: list[dict[str, Any]], reply: str | None) -> dict[str, Any]:
    """A stored response object as the route would pass it (built by hand here)."""
    return response_object(META, status=status, content=ResponseContent(output=output, reply=reply))


def reply_item(text: str, step: int) -> dict[str, Any]:
    return message_item(message_id(TURN, step), text, "completed", "final_answer")


# ---------------------------------------------------------------------------- real turns


def test_a_real_turn_with_a_tool_round_parses_to_its_reply(tmp_path: Path) -> None:
    """A scripted turn (a tool call, then a streamed answer) projected, with the stored
    object at its end: every event fits the client's models, the sequence numbers grow
    and each is ``seq * SLOTS + k``, and the client's accumulator ends with the reply as
    ``output_text`` after the tool round's two items."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "notes.md").write_text("hello\n")
    steps = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]},
        {"text": "The notes say hello.", "chunk_chars": 3},
    ]
    host = scripted_host([{"when": ".*", "steps": steps}])
    with parley.connect(f"sqlite:///{tmp_path / 'run.db'}", host=host) as client:
        handle = client.open_session(root).submit("what do the notes say?")
        events = list(handle.events())
        turn = client.store.get_turn(handle.turn_id)
        run = client.store.run_state(handle.turn_id)
        committed = client.store.steps_of(handle.turn_id)
    final = stored_response(turn, run, committed, model="gpt-test")
    projection = ResponsesProjection(meta_of(turn, run, [], model="gpt-test"))
    stream: list[dict[str, Any]] = []
    for event in events:
        batch = projection.project(event, final=final if event is events[-1] else None)
        assert [e["sequence_number"] // SLOTS for e in batch] == [event.seq] * len(batch)
        stream.extend(batch)
    numbers = [e["sequence_number"] for e in stream]
    assert numbers == sorted(set(numbers))
    kinds = [e["type"] for e in stream]
    assert kinds[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert deltas(stream) == "The notes say hello."

    parsed = parse(stream)
    assert parsed.output_text == "The notes say hello."
    assert parsed.status == "completed"
    assert [item.type for item in parsed.output] == [
        "function_call",
        "function_call_output",
        "message",
    ]
    call, result = parsed.output[0], parsed.output[1]
    assert call.type == "function_call" and call.name == "read_file"
    assert result.type == "function_call_output" and result.call_id == call.call_id
    assert "hello" in str(result.output)
    # The object the route answers for the turn (GET, a blocking create) is the same.
    check_response(final)
    assert isinstance(final["created_at"], int) and isinstance(final["completed_at"], int)
    assert turn.created_at.timestamp() - 1 < final["created_at"] <= final["completed_at"]
    stored = RESPONSE.validate_python(final)
    assert stored.output_text == "The notes say hello."
    assert stored.model == "scripted"  # the model the host used, not the one asked for
    assert stored.usage is not None and stored.usage.total_tokens == run.usage.total


def test_the_responses_projection_is_a_projection() -> None:
    """It is fed as every projection is (its ``end`` without the final object): it opens
    and closes with nothing, and feeds what ``project`` answers."""
    events = numbered([Queued(run_id="r"), Started(run_id="r", attempt=1, worker="w1")])
    projection: Projection = ResponsesProjection(META)
    fed = [*projection.opening(), *(item for e in events for item in projection.feed(e))]
    assert fed == project(events)
    assert projection.close("cut") == []


# ---------------------------------------------------------------------------- restarts


def test_a_redo_that_restreams_the_same_text_shows_it_once() -> None:
    """A worker died after streaming part of a step; the next one redoes the step with the
    same text.  The client's deltas add up to the text once, in one message item."""
    stream = project(
        numbered(
            [
                Queued(run_id="r"),
                Started(run_id="r", attempt=1, worker="w1"),
                Token(step=0, text="It retr"),
                Token(step=0, text="ies 50"),
                Started(run_id="r", attempt=2, worker="w2"),
                StepRestarted(step=0, reason="resumed"),
                Token(step=0, text="It re"),
                Token(step=0, text="tries 502 a"),
                Token(step=0, text="nd 504."),
                StepCommitted(step=0, text="It retries 502 and 504."),
                Ended(outcome="finished", reply="It retries 502 and 504."),
            ]
        ),
        final_object("completed", [reply_item("It retries 502 and 504.", 0)], "It retries…"),
    )
    assert deltas(stream) == "It retries 502 and 504."
    added = [e for e in stream if e["type"] == "response.output_item.added"]
    assert len(added) == 1
    assert parse(stream).output_text == "It retries 502 and 504."


def test_a_redo_that_says_something_else_replaces_the_held_message() -> None:
    """The redo diverges: the held message is closed ``incomplete`` and a new item carries
    the redo's whole text; the final response holds only the committed reply."""
    stream = project(
        numbered(
            [
                Queued(run_id="r"),
                Started(run_id="r", attempt=1, worker="w1"),
                Token(step=0, text="Hello wor"),
                StepRestarted(step=0, reason="diverged"),
                Token(step=0, text="Hello the"),
                Token(step=0, text="re."),
                StepCommitted(step=0, text="Hello there."),
                Ended(outcome="finished", reply="Hello there."),
            ]
        ),
        final_object("completed", [reply_item("Hello there.", 0)], "Hello there."),
    )
    done = [e["item"] for e in stream if e["type"] == "response.output_item.done"]
    assert [(i["status"], i["content"][0]["text"]) for i in done] == [
        ("incomplete", "Hello wor"),
        ("completed", "Hello there."),
    ]
    parsed = parse(stream)
    assert parsed.output_text == "Hello there."
    # The final object names the message the stream carried the reply in.
    last = parsed.output[-1]
    assert last.type == "message" and last.id == done[-1]["id"] != done[0]["id"]


def test_a_redo_shorter_than_what_the_client_holds_replaces_it() -> None:
    stream = project(
        numbered(
            [
                Queued(run_id="r"),
                Started(run_id="r", attempt=1, worker="w1"),
                Token(step=0, text="abcdef"),
                StepRestarted(step=0, reason="resumed"),
                Token(step=0, text="abc"),
                StepCommitted(step=0, text="abc"),
                Ended(outcome="finished", reply="abc"),
            ]
        ),
        final_object("completed", [reply_item("abc", 0)], "abc"),
    )
    done = [e["item"] for e in stream if e["type"] == "response.output_item.done"]
    assert [(i["status"], i["content"][0]["text"]) for i in done] == [
        ("incomplete", "abcdef"),
        ("completed", "abc"),
    ]
    assert parse(stream).output_text == "abc"


def test_a_redone_tool_call_is_not_sent_twice() -> None:
    """A worker died while a tool ran; the redo makes the same call and gets a result:
    the client sees one function_call item, one output, and the reply."""
    call = {"call_id": "call_0_0", "name": "wait_for_gate", "arguments": "{}"}
    stream = project(
        numbered(
            [
                Queued(run_id="r"),
                Started(run_id="r", attempt=1, worker="w1"),
                Token(step=0, text="Waiting. "),
                ToolCalled(step=0, **call),
                Started(run_id="r", attempt=2, worker="w2"),
                StepRestarted(step=0, reason="resumed"),
                Token(step=0, text="Waiting. "),
                ToolCalled(step=0, **call),
                ToolAnswered(step=0, call_id="call_0_0", name="wait_for_gate", content="opened"),
                StepCommitted(
                    step=0,
                    text="Waiting. ",
                    tool_calls=(ToolCall(id="call_0_0", name="wait_for_gate", arguments="{}"),),
                ),
                Token(step=1, text="Done."),
                StepCommitted(step=1, text="Done."),
                Ended(outcome="finished", reply="Done."),
            ]
        ),
        final_object(
            "completed",
            [
                {
                    "id": f"fc_{TURN.replace('-', '')}_0_call_0_0",
                    "type": "function_call",
                    "call_id": "call_0_0",
                    "name": "wait_for_gate",
                    "arguments": "{}",
                    "status": "completed",
                },
                {
                    "id": f"fco_{TURN.replace('-', '')}_0_call_0_0",
                    "type": "function_call_output",
                    "call_id": "call_0_0",
                    "output": "opened",
                    "status": "completed",
                },
                reply_item("Done.", 1),
            ],
            "Done.",
        ),
    )
    added = [e["item"]["type"] for e in stream if e["type"] == "response.output_item.added"]
    assert added == ["message", "function_call", "function_call_output", "message"]
    commentary = next(e["item"] for e in stream if e["type"] == "response.output_item.done")
    assert commentary["phase"] == "commentary" and commentary["status"] == "completed"
    assert deltas(stream) == "Waiting. Done."
    parsed = parse(stream)
    assert parsed.output_text == "Done."  # the commentary is shown, not the reply
    assert [i.type for i in parsed.output] == ["function_call", "function_call_output", "message"]


def test_call_ids_a_model_repeats_across_steps_stay_distinct() -> None:
    """A model that names every step's first call ``call_1``: the client's accumulator
    refuses two items with one call id, so a later step's is suffixed (and the stored
    object says the same)."""
    tool_steps: list[EventPayload] = []
    for step in range(2):
        tool_steps += [
            ToolCalled(step=step, call_id="call_1", name="list_files", arguments="{}"),
            ToolAnswered(step=step, call_id="call_1", name="list_files", content="a.txt"),
            StepCommitted(
                step=step,
                text="",
                tool_calls=(ToolCall(id="call_1", name="list_files", arguments="{}"),),
            ),
        ]
    committed = [
        CommittedStep(
            index=step,
            payload=StepPayload(
                tool_calls=(ToolCall(id="call_1", name="list_files", arguments="{}"),),
                tool_results=(ToolResult(call_id="call_1", name="list_files", content="a.txt"),),
            ),
        )
        for step in range(2)
    ] + [CommittedStep(index=2, payload=StepPayload(text="Two files."))]
    output = committed_output(TURN, committed, "Two files.")
    stream = project(
        numbered(
            [
                Queued(run_id="r"),
                Started(run_id="r", attempt=1, worker="w1"),
                *tool_steps,
                Token(step=2, text="Two files."),
                StepCommitted(step=2, text="Two files."),
                Ended(outcome="finished", reply="Two files."),
            ]
        ),
        final_object("completed", output, "Two files."),
    )
    parsed = parse(stream)
    calls = [i.call_id for i in parsed.output if i.type == "function_call"]
    assert calls == ["call_1", "call_1_1"]
    assert parsed.output_text == "Two files."


def test_a_replay_whose_tokens_aged_out_closes_each_steps_text() -> None:
    """Read after the replay buffer let the tokens go (a response retrieved a week later),
    each step's text arrives whole with its commit: the text of a step that called tools
    is closed as commentary before the next step's opens, so the client's accumulator
    takes the stream (it refuses to complete a response with an item left open)."""
    read = ToolCall(id="call_0_0", name="read_file", arguments="{}")
    stream = project(
        numbered(
            [
                Queued(run_id="r"),
                Started(run_id="r", attempt=1, worker="w1"),
                ToolCalled(step=0, call_id="call_0_0", name="read_file", arguments="{}"),
                ToolAnswered(step=0, call_id="call_0_0", name="read_file", content="A"),
                StepCommitted(step=0, text="Let me look.", tool_calls=(read,)),
                StepCommitted(step=1, text="It says A."),
                Ended(outcome="finished", reply="It says A."),
            ]
        ),
        final_object("completed", [reply_item("It says A.", 1)], "It says A."),
    )
    done = [e["item"] for e in stream if e["type"] == "response.output_item.done"]
    messages = [(i["status"], i["phase"], i["content"][0]["text"]) for i in done[2:]]
    assert messages == [
        ("completed", "commentary", "Let me look."),
        ("completed", "final_answer", "It says A."),
    ]
    assert parse(stream).output_text == "It says A."


def test_a_replay_closes_the_text_of_a_step_that_called_tools_as_commentary() -> None:
    """Without its tokens, a step that called tools shows its text at its commit, after
    its tool items: that text is commentary, closed there as a streamed step's is at its
    first call, not left open for the end to call incomplete (the last step said
    nothing)."""
    read = ToolCall(id="call_0_0", name="read_file", arguments="{}")
    stream = project(
        numbered(
            [
                Queued(run_id="r"),
                Started(run_id="r", attempt=1, worker="w1"),
                ToolCalled(step=0, call_id="call_0_0", name="read_file", arguments="{}"),
                ToolAnswered(step=0, call_id="call_0_0", name="read_file", content="A"),
                StepCommitted(step=0, text="Let me look.", tool_calls=(read,)),
                StepCommitted(step=1, text=""),
                Ended(outcome="finished", reply=""),
            ]
        ),
        final_object("completed", [], ""),
    )
    done = [e["item"] for e in stream if e["type"] == "response.output_item.done"]
    assert [(i["type"], i["status"], i.get("phase")) for i in done] == [
        ("function_call", "completed", None),
        ("function_call_output", "completed", None),
        ("message", "completed", "commentary"),
    ]
    assert parse(stream).status == "completed"


# One step's stream: chunks of text, then each redo's after a restart; and whether its
# tokens survived for the reader (a late replay has none).  Every step but the last
# calls a tool.
step_plan = st.tuples(
    st.lists(st.text(min_size=1, max_size=4), max_size=4),
    st.lists(st.lists(st.text(min_size=1, max_size=4), max_size=3), max_size=2),
    st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(step_plan, min_size=1, max_size=4))
def test_any_turn_projects_to_a_stream_the_client_takes_showing_the_committed_steps(
    plans: list[tuple[list[str], list[list[str]], bool]],
) -> None:
    payloads: list[EventPayload] = [Queued(run_id="r"), Started(run_id="r", attempt=1, worker="w")]
    committed: list[str] = []
    for index, (chunks, redos, tokens_kept) in enumerate(plans):
        attempts = [chunks, *redos]
        for n, attempt in enumerate(attempts):
            if n:
                payloads.append(StepRestarted(step=index, reason="failed"))
            if tokens_kept:
                payloads += [Token(step=index, text=c) for c in attempt]
        calls: tuple[ToolCall, ...] = ()
        if index < len(plans) - 1:
            calls = (ToolCall(id=f"call_{index}_0", name="list_files", arguments="{}"),)
            payloads.append(
                ToolCalled(step=index, call_id=calls[0].id, name="list_files", arguments="{}")
            )
            payloads.append(
                ToolAnswered(step=index, call_id=calls[0].id, name="list_files", content="-")
            )
        committed.append("".join(attempts[-1]))
        payloads.append(StepCommitted(step=index, text=committed[-1], tool_calls=calls))
    reply = committed[-1]
    payloads.append(Ended(outcome="finished", reply=reply))
    output = [reply_item(reply, len(plans) - 1)] if reply else []
    stream = project(numbered(payloads), final_object("completed", output, reply))
    numbers = [e["sequence_number"] for e in stream]
    assert numbers == sorted(set(numbers))
    assert parse(stream).status == "completed"
    # Each step's text once, in a message item the client holds completed (a redo's
    # retracted text is in one it was told is incomplete; its last word on an item wins).
    items = {}
    for event in stream:
        if event["type"] == "response.output_item.done" and event["item"]["type"] == "message":
            items[event["item"]["id"]] = event["item"]
    kept = [i["content"][0]["text"] for i in items.values() if i["status"] == "completed"]
    assert kept == [text for text in committed if text]


# ---------------------------------------------------------------------------- ends


def test_a_cancelled_response_ends_incomplete_with_status_cancelled() -> None:
    """An interrupt cut the stream: the partial message closes ``incomplete`` and the
    stream ends with ``response.incomplete`` carrying ``status: cancelled`` (the protocol
    has no cancelled event)."""
    stream = project(
        numbered(
            [
                Queued(run_id="r"),
                Started(run_id="r", attempt=1, worker="w1"),
                Token(step=0, text="Let me th"),
                Ended(outcome="cancelled"),
            ]
        ),
        final_object("cancelled", [], None),
    )
    assert stream[-1]["type"] == "response.incomplete"
    assert stream[-1]["response"]["status"] == "cancelled"
    validate(stream)
    done = [e["item"] for e in stream if e["type"] == "response.output_item.done"]
    assert [i["status"] for i in done] == ["incomplete"]


def test_an_end_a_resume_goes_on_from_closes_nothing_but_the_text() -> None:
    """An ``end`` that is not the turn's last (a resume followed it) does not end the
    stream: the resumed turn's events follow, and the last end completes it."""
    events = numbered(
        [
            Queued(run_id="r"),
            Started(run_id="r", attempt=1, worker="w1"),
            Token(step=0, text="Par"),
            Ended(outcome="cancelled"),
            Queued(run_id="r", resume=True),
            Started(run_id="r", attempt=2, worker="w1"),
            StepRestarted(step=0, reason="resumed"),
            Token(step=0, text="Partly done."),
            StepCommitted(step=0, text="Partly done."),
            Ended(outcome="finished", reply="Partly done."),
        ]
    )
    stream = project(events, final_object("completed", [reply_item("Partly done.", 0)], "x"))
    kinds = [e["type"] for e in stream]
    assert kinds.count("response.incomplete") == 0
    assert kinds.count("response.in_progress") == 2
    assert kinds[-1] == "response.completed"
    parsed = parse(stream)
    assert parsed.output_text == "Partly done."


@pytest.mark.parametrize(
    ("outcome", "error", "kind", "status"),
    [
        ("budget_exceeded", "max_tokens 10 reached (12 used)", "response.incomplete", "incomplete"),
        ("failed", "model failed: RuntimeError: down", "response.failed", "failed"),
    ],
)
def test_budgets_and_failures_end_the_stream_in_openai_terms(
    tmp_path: Path, outcome: str, error: str, kind: str, status: str
) -> None:
    """A turn whose budget ran out, and one whose model failed, on a real store: the
    object says ``incomplete`` (why, in ``incomplete_details``) or ``failed`` (with the
    error), and the stream's last event is the one OpenAI's clients look for."""
    root = tmp_path / "repo"
    root.mkdir()
    if outcome == "failed":
        host = parley.Host(model=_FailingModel())
        contract = None
    else:
        steps = [{"tool_calls": [{"name": "list_files", "arguments": {}}]}]
        host = scripted_host([{"when": ".*", "steps": steps}])
        contract = parley.TaskContract(max_tokens=10)
    with parley.connect(f"sqlite:///{tmp_path / 'run.db'}", host=host) as client:
        handle = client.open_session(root).submit("go", contract=contract)
        events = list(handle.events())
        turn = client.store.get_turn(handle.turn_id)
        run = client.store.run_state(handle.turn_id)
        committed = client.store.steps_of(handle.turn_id)
    final = stored_response(turn, run, committed)
    check_response(final)
    assert final["completed_at"] is None  # it did not complete
    obj = RESPONSE.validate_python(final)
    assert obj.status == status and obj.output_text == ""
    if status == "incomplete":
        assert obj.incomplete_details is not None
        assert obj.incomplete_details.reason == "max_output_tokens"
        assert obj.max_output_tokens == 10
    else:
        assert obj.error is not None and "down" in obj.error.message
    projection = ResponsesProjection(meta_of(turn, run, committed))
    stream = [
        e
        for event in events
        for e in projection.project(event, final=final if event is events[-1] else None)
    ]
    assert stream[-1]["type"] == kind
    validate(stream)


class _FailingModel:
    name = "failing"

    def stream(self, request: Any, on_delta: Any) -> Any:
        raise RuntimeError("down")


def test_a_call_waiting_for_a_person_is_an_approval_request_of_a_response_in_progress(
    tmp_path: Path,
) -> None:
    """A turn whose call asks for approval: while it waits, its response is
    ``in_progress`` with an ``mcp_approval_request`` item naming the approval id (what a
    person answers); the stream shows that item, then, once approved, the call, its
    output and the reply."""
    root = tmp_path / "repo"
    root.mkdir()
    steps = [{"tool_calls": [{"name": "list_files", "arguments": {}}]}, {"text": "Listed."}]
    host = scripted_host(
        [{"when": ".*", "steps": steps}], policy=parley.Policy(ask_tools=["list_files"])
    )
    with parley.connect(f"sqlite:///{tmp_path / 'run.db'}", host=host) as client:
        handle = client.open_session(root).submit("list them")
        deadline = time.monotonic() + 30
        while handle.record().status is not TurnStatus.WAITING:
            assert time.monotonic() < deadline, "the turn never waited"
            time.sleep(0.02)
        store = client.store
        waiting = stored_response(
            handle.record(),
            store.run_state(handle.turn_id),
            store.steps_of(handle.turn_id),
            approvals=store.approvals(handle.turn_id),
        )
        [pending] = handle.approvals()
        handle.approve(pending.approval_id)
        handle.wait(timeout=30)
        events = list(handle.events())
        turn, run = handle.record(), store.run_state(handle.turn_id)
        final = stored_response(
            turn, run, store.steps_of(handle.turn_id), approvals=store.approvals(handle.turn_id)
        )
    # The waiting call is OpenAI's item, not the specification's: all else is the latter's.
    check_response({**waiting, "output": []})
    shown = RESPONSE.validate_python(waiting)
    assert shown.status == "in_progress"
    [request] = shown.output
    assert request.type == "mcp_approval_request"
    assert (request.id, request.name) == (pending.approval_id, "list_files")
    projection = ResponsesProjection(meta_of(turn, run, []))
    stream = [
        e
        for event in events
        for e in projection.project(event, final=final if event is events[-1] else None)
    ]
    parsed = parse(stream)
    assert [i["item"]["type"] for i in stream if i["type"] == "response.output_item.done"] == [
        "mcp_approval_request",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert parsed.output_text == "Listed."
    assert [i.type for i in parsed.output] == ["function_call", "function_call_output", "message"]


def test_a_projection_is_the_same_every_time() -> None:
    """Resuming after ``N`` projects the turn again from its first event: two projections
    of one event list give the very same events, so the rest after any ``N`` is exact."""
    events = numbered(
        [
            Queued(run_id="r"),
            Started(run_id="r", attempt=1, worker="w1"),
            Token(step=0, text="Hel"),
            StepRestarted(step=0, reason="resumed"),
            Token(step=0, text="Help"),
            ToolCalled(step=0, call_id="c", name="list_files", arguments="{}"),
            ToolAnswered(step=0, call_id="c", name="list_files", content="x"),
            StepCommitted(
                step=0,
                text="Help",
                tool_calls=(ToolCall(id="c", name="list_files", arguments="{}"),),
            ),
            Token(step=1, text="ok"),
            StepCommitted(step=1, text="ok"),
            Ended(outcome="finished", reply="ok"),
        ]
    )
    final = final_object("completed", [reply_item("ok", 1)], "ok")
    first, second = project(events, final), project(events, final)
    assert first == second
    assert deltas(first) == "Help" + "ok"

"""Context assembly: stored rows → the model-visible messages of the next request.

Replay is *checked*: every assistant tool call must be answered by exactly one tool result
before the conversation goes on, or :class:`CodecError` is raised instead of sending orphan
messages to a provider.  Interrupted partial text is display-only and never appears here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from parley.ports.backend import CommittedStep, PathTurn
from parley.schemas.errors import CodecError
from parley.schemas.messages import AssistantMessage, Message, StepInput, ToolMessage, UserMessage


def step_messages(step: CommittedStep) -> list[Message]:
    """One committed step as messages: its inputs, the assistant turn, the tool results."""
    payload = step.payload
    messages: list[Message] = [UserMessage(text=i.text, origin=i.origin) for i in payload.inputs]
    messages.append(AssistantMessage(text=payload.text, tool_calls=payload.tool_calls))
    results = {r.call_id: r for r in payload.tool_results}
    if len(results) != len(payload.tool_results):
        raise CodecError(f"step {step.index}: a tool call has more than one result")
    for call in payload.tool_calls:
        result = results.pop(call.id, None)
        if result is None:
            raise CodecError(f"step {step.index}: tool call {call.id} ({call.name}) has no result")
        messages.append(
            ToolMessage(
                call_id=call.id, name=call.name, content=result.content, is_error=result.is_error
            )
        )
    if results:
        raise CodecError(f"step {step.index}: results for unknown calls {sorted(results)}")
    return messages


def turn_messages(prompt: str, steps: Iterable[CommittedStep]) -> list[Message]:
    """A turn's prompt followed by its committed steps."""
    messages: list[Message] = [UserMessage(text=prompt, origin="prompt")]
    for step in steps:
        messages.extend(step_messages(step))
    return messages


def turn_replay(prompt: str, steps: Iterable[CommittedStep]) -> tuple[Message, ...]:
    """One past turn as checked messages.  A turn ends with complete tool rounds, so a
    history made of checked turns is checked as a whole."""
    return check_replay(turn_messages(prompt, steps))


def replay_loaded(node: PathTurn) -> tuple[Message, ...]:
    """A history turn whose steps came with it, replayed."""
    if node.steps is None:
        raise CodecError(f"turn {node.turn.turn_id}: its steps were not loaded")
    return turn_replay(node.turn.prompt, node.steps)


def history_messages(
    history: Sequence[PathTurn],
    replay: Callable[[PathTurn], tuple[Message, ...]] = replay_loaded,
) -> tuple[Message, ...]:
    """The history path as messages, checked, each turn replayed by ``replay`` (the
    engine's answers from its replay cache).  The history does not change during a turn,
    so the engine builds it once per turn rather than once per step."""
    messages: list[Message] = []
    for node in history:
        messages.extend(replay(node))
    return tuple(messages)


def assemble(
    past: tuple[Message, ...],
    prompt: str,
    steps: Sequence[CommittedStep],
    inputs: Sequence[StepInput],
    fit: Callable[[tuple[Message, ...], tuple[Message, ...]], tuple[Message, ...]] | None = None,
) -> tuple[Message, ...]:
    """The messages of parley's own next request: the history (from
    :func:`history_messages`), this turn so far, and the input entering at this boundary
    (see :func:`assemble_request`)."""
    return assemble_request(past, turn_messages(prompt, steps), inputs, fit)


def assemble_request(
    past: tuple[Message, ...],
    turn: Sequence[Message],
    inputs: Sequence[StepInput],
    fit: Callable[[tuple[Message, ...], tuple[Message, ...]], tuple[Message, ...]] | None = None,
) -> tuple[Message, ...]:
    """The messages of a request: the history, this turn's part (parley's replay of it,
    or what a driver built), and the input entering at this boundary.  The history was
    checked and ends with complete rounds, so checking this turn's part checks the whole.

    ``fit(past, current)`` (a context budget) may elide parts of both; what it returns
    is checked again, since that is what the provider will see."""
    current: list[Message] = list(turn)
    current.extend(UserMessage(text=i.text, origin=i.origin) for i in inputs)
    checked = check_replay(current)
    if fit is None:
        return past + checked
    return check_replay(fit(past, checked))


def check_replay(messages: Sequence[Message]) -> tuple[Message, ...]:
    """Raise :class:`CodecError` if any tool round is incomplete; return the messages."""
    open_calls: dict[str, str] = {}
    for position, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            if message.call_id not in open_calls:
                raise CodecError(
                    f"message {position}: tool result {message.call_id} answers no open call"
                )
            del open_calls[message.call_id]
            continue
        if open_calls:
            raise CodecError(
                f"message {position}: conversation goes on while tool calls "
                f"{sorted(open_calls)} have no result"
            )
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                if call.id in open_calls:
                    raise CodecError(f"message {position}: duplicate tool call id {call.id}")
                open_calls[call.id] = call.name
    if open_calls:
        raise CodecError(f"the conversation ends with unanswered tool calls {sorted(open_calls)}")
    return tuple(messages)

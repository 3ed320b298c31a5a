"""The commands about one turn: ``submit``, ``resume``, ``follow``, ``say``, ``interrupt``
and ``approve``."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from rich.console import Console
from rich.text import Text

import parley
from parley.cli.connecting import client_for, names_a_host
from parley.cli.text_input import prompt_line, text_argument
from parley.cli.watching import unclaimed_notice, watch
from parley.errors import InvalidRequest
from parley.render import EventPrinter, approval_line
from parley.tree_reading import TreeReader
from parley.validation import MAX_PROMPT_BYTES, MAX_STEER_BYTES


def submit(args: argparse.Namespace, console: Console) -> int:
    # Read before anything is opened: a missing file or an empty stdin changes nothing.
    prompt, source = text_argument(
        args.prompt, args.prompt_file, what="prompt", option="--prompt-file", limit=MAX_PROMPT_BYTES
    )
    contract = None
    if args.max_steps is not None or args.max_tokens is not None or args.check is not None:
        contract = parley.TaskContract(
            max_steps=args.max_steps, max_tokens=args.max_tokens, check=args.check
        )
    at = _time_argument(args.at)
    with client_for(args, runs_turns=True) as client:
        session = client.session(args.session_id)
        handle = session.submit(
            prompt,
            contract=contract,
            request_id=args.request_id,
            priority=args.priority,
            at=at,
            after=args.after,
        )
        console.print(prompt_line(prompt, source), soft_wrap=True)
        not_before = handle.submitted.not_before
        if not_before is not None:
            console.print(f"waiting until {not_before.isoformat()}", style="dim")
        with unclaimed_notice(client, handle):
            return watch(handle, console, workers=client.fleet)


def _time_argument(value: str | None) -> datetime | None:
    """``--at`` as a datetime (whether it has its offset is the submission's to say)."""
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(f"--at must be an ISO 8601 time, not {value!r}") from None


def resume(args: argparse.Namespace, console: Console) -> int:
    with client_for(args, runs_turns=True) as client:
        turn = client.attach(args.turn_id)
        seen = turn.latest_seq()  # what came before is history: `follow` shows it
        handle = client.session(turn.session_id).resume(turn.turn_id)
        with unclaimed_notice(client, handle):
            return watch(handle, console, after=seen, workers=client.fleet)


def follow(args: argparse.Namespace, console: Console) -> int:
    with client_for(args) as client:
        printer = EventPrinter(console, workers=True)
        # The turn's tree: its children indented under their calls (docs/sub-agents.md).
        for event in TreeReader(client.attach(args.turn_id), args.after):
            printer(event)
    return 0


def say(args: argparse.Namespace, console: Console) -> int:
    text, _source = text_argument(
        args.text, args.text_file, what="message", option="--text-file", limit=MAX_STEER_BYTES
    )
    with client_for(args) as client:
        handle = client.attach(args.turn_id)
        position = handle.say(text)
        console.print(
            f"steer {position} accepted: the model reads it at the turn's next step boundary",
            soft_wrap=True,
        )
    return 0


def interrupt(args: argparse.Namespace, console: Console) -> int:
    # Embedded, interrupting a turn that waits for answers denies them, and the process
    # with the host (--host, PARLEY_HOST, PARLEY_MODEL) commits the turn's end; on a fleet
    # a worker does.
    with client_for(args, runs_turns=names_a_host(args)) as client:
        handle = client.attach(args.turn_id)
        handle.interrupt()
        console.print(
            f"interrupt accepted: the turn stops at its next step boundary; continue it "
            f"with: parley resume {handle.turn_id}",
            soft_wrap=True,
        )
    return 0


def signal(args: argparse.Namespace, console: Console) -> int:
    """Send an event to a turn (docs/time.md#waiting-for-an-event)."""
    payload: object = None
    if args.payload is not None:
        try:
            payload = json.loads(args.payload)
        except ValueError as exc:
            raise InvalidRequest(
                f"the payload is not JSON ({exc}); quote text as JSON: '\"yes\"'"
            ) from exc
    # Embedded, the process that wakes the turn drives it on, if it has the host (--host,
    # PARLEY_HOST, PARLEY_MODEL); on a fleet a worker does.
    runs_turns = names_a_host(args)
    with client_for(args, runs_turns=runs_turns) as client:
        handle = client.attach(args.turn_id)
        if not handle.signal(args.name, payload):
            console.print(
                f"signal {args.name} kept: no call of the turn waits for it yet; the first "
                "that does takes it",
                soft_wrap=True,
            )
            return 0
        console.print(f"signal {args.name} delivered: the waiting call has its result")
        if client.fleet or not runs_turns:
            return 0  # a worker goes on with it, or a process with the host
        printer = EventPrinter(console)
        for event in handle.events(after=handle.latest_seq()):
            printer(event)
    return 0


def approve(args: argparse.Namespace, console: Console) -> int:
    # Embedded, the process that answers the last call drives the turn on, if it has the
    # host (--host, PARLEY_HOST, PARLEY_MODEL); on a fleet a worker does.
    runs_turns = names_a_host(args)
    with client_for(args, runs_turns=runs_turns) as client:
        handle = client.attach(args.turn_id)
        if args.approval_id is None:
            return _list_waiting(args, handle, console)
        if args.deny is not None:
            answered = handle.deny(args.approval_id, reason=args.deny or None)
        else:
            answered = handle.approve(args.approval_id)
        console.print(approval_line(answered), soft_wrap=True)
        if handle.approvals() or client.fleet:
            return 0  # more answers to come, or a worker goes on with it
        if not runs_turns:
            console.print(
                Text(
                    f"every answer is in: `parley resume {handle.turn_id}` (with the host) "
                    "goes on with the turn",
                    "dim",
                ),
                soft_wrap=True,
            )
            return 0
        printer = EventPrinter(console)
        for event in handle.events(after=handle.latest_seq()):
            printer(event)
    return 0


def _list_waiting(args: argparse.Namespace, handle: parley.TurnHandle, console: Console) -> int:
    """``approve TURN`` without a call to answer: the calls that wait for one."""
    if args.deny is not None:
        raise parley.errors.InvalidRequest("--deny needs the APPROVAL_ID it answers")
    waiting = handle.approvals()
    for approval in waiting:
        console.print(approval_line(approval), soft_wrap=True)
    if not waiting:
        console.print(Text("no call of this turn waits for an answer", "dim"))
    return 0

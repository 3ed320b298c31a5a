"""A replay's report (docs/replay.md#the-report): the original's turns and the replay's
side by side, with their tool calls compared, their cost from one table of model prices,
and a similarity score per reply."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from parley.errors import InvalidRequest
from parley.ports.backend import CommittedStep
from parley.replay_tools import call_key
from parley.schemas.messages import ToolCall
from parley.schemas.records import Usage
from parley.store.sql_store import SqlStore

MODEL_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "o3-mini": (1.10, 4.40),
    "claude-3-5-sonnet-latest": (3.00, 15.00),
    "claude-3-5-haiku-latest": (0.80, 4.00),
    "claude-sonnet-4-0": (3.00, 15.00),
    "claude-opus-4-0": (15.00, 75.00),
    "scripted": (0.0, 0.0),
}
"""US dollars per million input and output tokens, by model name (its provider prefix
and any ``-YYYY-MM-DD`` date left off).  A model not in it has no cost (None)."""

JUDGE_PROMPT = (
    "Rate how well the second answer does what the first did, from 0 (not at all) to 1 "
    "(as well or better). Answer with the number only.\n\nFirst answer:\n{original}\n\n"
    "Second answer:\n{replay}"
)


def price_of(model: str) -> tuple[float, float] | None:
    """The model's prices from :data:`MODEL_PRICES` (None: not listed)."""
    name = model.split(":", 1)[-1].strip()
    name = re.sub(r"-\d{4}-\d{2}-\d{2}$", "", name)
    if name.startswith("scripted") or model.startswith("scripted"):
        return MODEL_PRICES["scripted"]
    return MODEL_PRICES.get(name)


def cost_of(steps: Sequence[CommittedStep]) -> float | None:
    """What the steps' model calls cost, each at its own model's price (None if any
    model is not in the table)."""
    total = 0.0
    for step in steps:
        price = price_of(step.payload.model)
        if price is None:
            return None
        usage = step.payload.usage
        total += (usage.input_tokens * price[0] + usage.output_tokens * price[1]) / 1e6
    return round(total, 8)


def compare_calls(original: Sequence[ToolCall], replay: Sequence[ToolCall]) -> dict[str, Any]:
    """The calls both made alike (``same``), with the same tool but other arguments
    (``differing``), made by the replay only (``added``) or by the original only
    (``missing``)."""
    left = list(original)
    same, added, differing = [], [], []
    for call in replay:
        match = next(
            (
                c
                for c in left
                if call_key(c.name, c.arguments) == call_key(call.name, call.arguments)
            ),
            None,
        )
        if match is not None:
            left.remove(match)
            same.append(_call(call))
            continue
        added.append(call)
    for call in list(added):
        match = next((c for c in left if c.name == call.name), None)
        if match is not None:
            left.remove(match)
            added.remove(call)
            differing.append(
                {"name": call.name, "original": match.arguments, "replay": call.arguments}
            )
    return {
        "same": same,
        "added": [_call(c) for c in added],
        "missing": [_call(c) for c in left],
        "differing": differing,
    }


def _call(call: ToolCall) -> dict[str, str]:
    return {"name": call.name, "arguments": call.arguments}


def side(store: SqlStore, turn_id: str) -> dict[str, Any]:
    """One turn as the report shows it."""
    turn = store.get_turn(turn_id)
    state = store.run_state(turn_id)
    steps = store.steps_of(turn_id)
    usage = sum((s.payload.usage for s in steps), Usage())
    ended = state.ended_at
    return {
        "turn_id": turn_id,
        "reply": turn.reply or "",
        "outcome": str(turn.status),
        "error": state.error,
        "steps": len(steps),
        "models": sorted({s.payload.model for s in steps if s.payload.model}),
        "tool_calls": [_call(c) for s in steps for c in s.payload.tool_calls],
        "tokens": {"input": usage.input_tokens, "output": usage.output_tokens},
        "cost": cost_of(steps),
        "duration": None if ended is None else round((ended - turn.created_at).total_seconds(), 3),
    }


def report(
    store: SqlStore,
    original_id: str,
    replay_id: str,
    pairs: Sequence[tuple[str, str]],
    *,
    scorer: Callable[[str, str], float] | Any = None,
) -> dict[str, Any]:
    """The report of a replay (``pairs``: each original turn id with its replay's)."""
    score = scorer_of(scorer)
    turns = []
    for index, (original_turn, replay_turn) in enumerate(pairs):
        before, after = side(store, original_turn), side(store, replay_turn)
        calls = compare_calls(_calls(store, original_turn), _calls(store, replay_turn))
        similarity = round(
            difflib.SequenceMatcher(None, before["reply"], after["reply"]).ratio(), 4
        )
        entry: dict[str, Any] = {
            "index": index,
            "prompt": store.get_turn(original_turn).prompt,
            "original": before,
            "replay": after,
            "tool_calls": calls,
            "similarity": similarity,
            **_scored(score, before["reply"], after["reply"]),
        }
        entry["changed"] = similarity < 1.0 or any(
            calls[k] for k in ("added", "missing", "differing")
        )
        turns.append(entry)
    return {"original": original_id, "replay": replay_id, "totals": _totals(turns), "turns": turns}


def _calls(store: SqlStore, turn_id: str) -> list[ToolCall]:
    return [c for s in store.steps_of(turn_id) for c in s.payload.tool_calls]


def _totals(turns: Sequence[dict[str, Any]]) -> dict[str, Any]:
    def total(which: str, key: str) -> Any:
        values = [t[which][key] for t in turns]
        if any(v is None for v in values):
            return None
        return round(sum(values), 8)

    totals: dict[str, Any] = {"turns": len(turns), "changed": sum(1 for t in turns if t["changed"])}
    for which in ("original", "replay"):
        totals[which] = {
            "tokens": sum(
                t[which]["tokens"]["input"] + t[which]["tokens"]["output"] for t in turns
            ),
            "cost": total(which, "cost"),
            "duration": total(which, "duration"),
            "finished": sum(1 for t in turns if t[which]["outcome"] == "finished"),
        }
    similarities = [t["similarity"] for t in turns]
    totals["similarity"] = round(sum(similarities) / len(similarities), 4) if similarities else None
    scores = [t["score"] for t in turns if t["score"] is not None]
    totals["score"] = round(sum(scores) / len(scores), 4) if scores else None
    totals["score_errors"] = sum(1 for t in turns if "score_error" in t)
    return totals


def _scored(
    score: Callable[[str, str], float] | None, original: str, replay: str
) -> dict[str, Any]:
    """A turn's ``score`` (None without a scorer), asked once; a scorer that fails (a
    judge model's error, an answer with no number) leaves it None and says why in
    ``score_error``: one turn's judge failing costs that turn's score, not the report."""
    if score is None:
        return {"score": None}
    try:
        return {"score": float(score(original, replay))}
    except Exception as exc:  # the scorer is the caller's code, or a model over the network
        return {"score": None, "score_error": f"{type(exc).__name__}: {exc}"}


def scorer_of(scorer: Any) -> Callable[[str, str], float] | None:
    """A scorer as given: None, a function, or a judge: a model, a host (its model) or a
    model's name as ``PARLEY_MODEL`` gives one, resolved here, in the process that
    computes the report (on a fleet, the caller's, not a worker's)."""
    if scorer is None:
        return None
    if isinstance(scorer, str):
        if not scorer.strip():
            raise InvalidRequest("scorer must not be an empty model name")
        from parley.models.selection import model_from_spec

        scorer = model_from_spec(scorer)
    elif not callable(getattr(scorer, "stream", None)) and callable(
        getattr(getattr(scorer, "model", None), "stream", None)
    ):
        scorer = scorer.model  # a host: its model judges
    if callable(getattr(scorer, "stream", None)):
        judge = scorer
        return lambda original, replay: _judge(judge, original, replay)
    if callable(scorer):
        return scorer  # type: ignore[no-any-return]
    raise InvalidRequest(
        "scorer must be a function (original, replay) -> number, or a judge: a model, a "
        "host, or a model's name as PARLEY_MODEL gives one"
    )


def _judge(model: Any, original: str, replay: str) -> float:
    from parley.ports.host import ModelRequest
    from parley.schemas.messages import Prefix, UserMessage

    prompt = JUDGE_PROMPT.format(original=original, replay=replay)
    request = ModelRequest(
        prefix=Prefix(system_prompt="You compare two answers.", tools=()),
        messages=(UserMessage(text=prompt),),
    )
    reply = model.stream(request, lambda _text: None)
    found = re.search(r"\d+(?:\.\d+)?", reply.text)
    if found is None:
        raise InvalidRequest(f"the judge model answered no number: {reply.text[:200]!r}")
    return min(1.0, max(0.0, float(found.group())))


def to_json(report_: dict[str, Any]) -> str:
    """The report as JSON text."""
    return json.dumps(report_, indent=2, sort_keys=False)


def sum_totals(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The totals of many replays' reports, summed (a cost is None if any is)."""
    turns = [t for r in reports for t in r["turns"]]
    totals = _totals(turns)
    totals["sessions"] = len(reports)
    return totals

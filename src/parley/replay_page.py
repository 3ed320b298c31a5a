"""The replay report as one HTML page (``parley replay --report out.html``): totals on
top, then one row per turn with the original's and the replay's side by side, the turns
that changed and the tool calls that differ highlighted."""

from __future__ import annotations

from html import escape
from typing import Any

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; width: 100%; }
th, td { border: 1px solid #ccc; padding: 6px 8px; vertical-align: top; text-align: left; }
th { background: #f2f2f2; }
tr.changed td { background: #fff8e1; }
.totals td, .totals th { width: auto; }
.reply { white-space: pre-wrap; max-width: 40em; }
.added { color: #1b5e20; } .missing { color: #b71c1c; } .differing { color: #e65100; }
.same { color: #555; }
"""


def _money(value: Any) -> str:
    return "n/a" if value is None else f"${value:.4f}"


def _totals(totals: dict[str, Any], batch_id: str | None) -> str:
    rows = []
    for which in ("original", "replay"):
        side = totals[which]
        rows.append(
            f"<tr><th>{which}</th><td>{side['finished']} finished</td>"
            f"<td>{side['tokens']} tokens</td><td>{_money(side['cost'])}</td>"
            f"<td>{side['duration'] if side['duration'] is not None else 'n/a'} s</td></tr>"
        )
    scored = ""
    if totals.get("score") is not None or totals.get("score_errors"):
        scored = f", mean score {totals.get('score')}"
        if totals.get("score_errors"):
            scored += f" ({totals['score_errors']} turns not scored)"
    batch = f" (batch <code>{escape(batch_id)}</code>)" if batch_id else ""
    return (
        f"<p id='summary'>{totals.get('sessions', 1)} sessions, {totals['turns']} turns, "
        f"<b>{totals['changed']} changed</b>, mean similarity {totals['similarity']}"
        f"{scored}{batch}</p>"
        "<table class='totals'><tr><th></th><th>outcomes</th><th>tokens</th><th>cost</th>"
        f"<th>duration</th></tr>{''.join(rows)}</table>"
    )


def _calls(compared: dict[str, Any]) -> str:
    items = []
    for kind in ("same", "added", "missing"):
        for call in compared[kind]:
            items.append(
                f"<li class='{kind}'>{kind}: {escape(call['name'])} "
                f"<code>{escape(call['arguments'])}</code></li>"
            )
    for call in compared["differing"]:
        items.append(
            f"<li class='differing'>differing: {escape(call['name'])} "
            f"<code>{escape(call['original'])}</code> → <code>{escape(call['replay'])}</code></li>"
        )
    return f"<ul>{''.join(items)}</ul>" if items else ""


def _side(side: dict[str, Any]) -> str:
    tokens = side["tokens"]["input"] + side["tokens"]["output"]
    return (
        f"<div class='reply'>{escape(side['reply'])}</div>"
        f"<small>{escape(side['outcome'])}, {side['steps']} steps, {tokens} tokens, "
        f"{_money(side['cost'])}, {side['duration']} s</small>"
    )


def _row(session: dict[str, Any], turn: dict[str, Any]) -> str:
    changed = " class='changed'" if turn["changed"] else ""
    score = "" if turn["score"] is None else f"<br>score {turn['score']}"
    if "score_error" in turn:
        score = f"<br><span class='missing'>not scored: {escape(turn['score_error'][:300])}</span>"
    return (
        f"<tr{changed}><td><code>{escape(session['original'][:8])}</code> #{turn['index']}"
        f"<br>{escape(turn['prompt'][:300])}</td><td>{_side(turn['original'])}</td>"
        f"<td>{_side(turn['replay'])}</td><td>{_calls(turn['tool_calls'])}</td>"
        f"<td>{turn['similarity']}{score}</td></tr>"
    )


def render(report: dict[str, Any]) -> str:
    """The page of a report of many replays (``ReplayMany.report()``)."""
    rows = "".join(_row(s, t) for s in report["sessions"] for t in s["turns"])
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>parley replay</title>"
        f"<style>{STYLE}</style></head><body><h1>Replay report</h1>"
        f"{_totals(report['totals'], report.get('batch'))}"
        "<h2>Turns</h2><table id='turns'><tr><th>turn</th>"
        "<th>original</th><th>replay</th><th>tool calls</th><th>similarity</th></tr>"
        f"{rows}</table></body></html>"
    )

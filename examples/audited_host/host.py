"""A host as a product would write one: its caller's identity from the host context, a
system prompt that refreshes when its tools change, a validation hook, and an audit
table of its own that every committed turn is written to.

``PARLEY_HOST=examples.audited_host.host:host`` loads it (embedded or on workers);
``AUDIT_DB`` names its audit database (default ``audit.db``), ``AUDIT_SCRIPT`` an
offline script for its model (default: the one beside this file), ``AUDIT_TOOLS=lean``
leaves its ``release_notes`` tool out (so the prefix refreshes).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import parley

HERE = Path(__file__).parent
SYSTEM_PROMPT = "You are the release assistant of Acme. Answer the person asking, by name."


@parley.tool
def whoami(context: parley.ToolContext) -> str:
    """Says who is asking, from the caller's identity the product passed along."""
    user = context.host_context.get("user", "someone")
    team = context.host_context.get("team", "no team")
    return f"{user} ({team})"


@parley.tool
def release_notes(version: str) -> str:
    """The release notes of a version.

    Args:
        version: the version, as in 1.2.3.
    """
    return f"{version}: faster retries, fewer surprises."


class Audit:
    """The product's own table of committed turns, in its own database."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._guard = threading.Lock()
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS audit (turn_id TEXT PRIMARY KEY, session_id TEXT,"
                " outcome TEXT, reply TEXT, user TEXT, host_context TEXT, path TEXT)"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def write(self, receipt: parley.CommitReceipt) -> None:
        """One committed turn; a retried hook call writes it once."""
        outcome = receipt.outcome
        context = dict(receipt.host_context)
        with self._guard, self._connect() as db:
            db.execute(
                "INSERT OR IGNORE INTO audit VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    outcome.turn_id,
                    outcome.session_id,
                    outcome.outcome,
                    outcome.reply,
                    context.get("user"),
                    json.dumps(context, sort_keys=True),
                    json.dumps(list(receipt.path)),
                ),
            )

    def rows(self) -> list[tuple[Any, ...]]:
        """Everything written, oldest first."""
        with self._connect() as db:
            return list(db.execute("SELECT * FROM audit ORDER BY rowid"))


class ProductHooks(parley.SessionHooks):
    """The product's rules around each turn."""

    def __init__(self, tools: list[Any], audit: Audit) -> None:
        self.tools = tools
        self.audit = audit

    def before_turn(
        self,
        request: parley.TurnRequest,
        options: parley.TurnOptions,
        state: parley.SessionStateView,
    ) -> parley.TurnPreparation | None:
        """A caller must say who it is; the prefix is refreshed when the tools changed."""
        if not options.host_context.get("user"):
            raise parley.errors.InvalidRequest("this product answers only a named user")
        declared = tuple(tool.declaration for tool in self.tools)
        if state.prefix is not None and state.prefix.tools != declared:
            return parley.TurnPreparation(
                prefix=parley.PrefixSnapshot.refreshing(SYSTEM_PROMPT, declared)
            )
        return None

    def before_commit(self, outcome: parley.TurnOutcome, context: Any) -> None:
        """Nothing leaves that promises a date: the product does not promise dates."""
        if outcome.reply and "guarantee" in outcome.reply.lower():
            raise ValueError("replies never guarantee anything")

    def after_commit(self, receipt: parley.CommitReceipt) -> None:
        """Every committed turn, with who asked, into the product's own table."""
        self.audit.write(receipt)


def build_host() -> parley.Host:
    """The host, as the environment configures it."""
    tools = [*parley.tools.WORKSPACE_TOOLS, whoami]
    if os.environ.get("AUDIT_TOOLS") != "lean":
        tools.append(release_notes)
    script = os.environ.get("AUDIT_SCRIPT") or str(HERE / "script.json")
    return parley.Host(
        model=parley.models.ScriptedModel(script),
        system_prompt=SYSTEM_PROMPT,
        tools=tools,
        hooks=ProductHooks(tools, Audit(os.environ.get("AUDIT_DB", "audit.db"))),
    )


host = build_host

"""parley: durable, streamable, steerable LLM-agent conversations.

``parley.connect()`` opens a client; a client opens or reopens sessions; a session runs
turns (blocking, observed, bounded, or submitted for later) that stream events, take
steers and interrupts, and survive the process that started them.
"""

from parley import errors, models, tools
from parley.client import Client, Session, TurnHandle, connect
from parley.host import Host, load_host
from parley.policy import ApproveAll, Policy
from parley.tools.decorator import tool
from schemas.events import Event, EventKind
from schemas.records import Contract as TaskContract
from schemas.records import IfBusy, TurnRecord, TurnResult, TurnStatus, Usage
from workers.budget import ContextBudget, estimate_tokens
from workers.ports import (
    ApprovalRequest,
    CommitReceipt,
    PrefixSnapshot,
    TurnOutcome,
    TurnPreparation,
)

__all__ = [
    "ApprovalRequest",
    "ApproveAll",
    "Client",
    "CommitReceipt",
    "ContextBudget",
    "Event",
    "EventKind",
    "Host",
    "IfBusy",
    "Policy",
    "PrefixSnapshot",
    "Session",
    "TaskContract",
    "TurnHandle",
    "TurnOutcome",
    "TurnPreparation",
    "TurnRecord",
    "TurnResult",
    "TurnStatus",
    "Usage",
    "connect",
    "errors",
    "estimate_tokens",
    "load_host",
    "models",
    "tool",
    "tools",
]

"""parley: durable, streamable, steerable LLM-agent conversations.

``parley.connect()`` opens a client; a client opens or reopens sessions; a session runs
turns (blocking, observed, bounded, or submitted for later) that stream events, take
steers and interrupts, and survive the process that started them.
"""

from parley import errors, models, tools, transcript
from parley.batches import Batch, BatchState
from parley.client import Client, connect
from parley.host import Host, load_host
from parley.policy import ApproveAll, AskAlways, Policy
from parley.session import Session
from parley.tools.decorator import tool
from parley.turn_handle import TurnHandle
from schemas.events import Event, EventKind
from schemas.operations import DeliveryState, PrunedSession, PruneReport, WebhookDelivery
from schemas.records import (
    Approval,
    Decision,
    IfBusy,
    TaskContract,
    TurnRecord,
    TurnResult,
    TurnStatus,
    Usage,
)
from workers.engine.agent_loop import AgentLoop
from workers.ports.admission import Limits
from workers.ports.budget import ContextBudget, estimate_tokens
from workers.ports.driver import DriverInput, DriverStep, DriverTurn, SessionDriver, TurnStopped
from workers.ports.host import (
    Access,
    ApprovalRequest,
    Ask,
    CommitReceipt,
    ModelReply,
    ModelRequest,
    PrefixSnapshot,
    Refusal,
    SessionHooks,
    SessionStateView,
    StreamAborted,
    ToolContext,
    TurnOptions,
    TurnOutcome,
    TurnPreparation,
    TurnRequest,
)

__all__ = [
    "Access",
    "AgentLoop",
    "Approval",
    "ApprovalRequest",
    "ApproveAll",
    "Ask",
    "AskAlways",
    "Batch",
    "BatchState",
    "Client",
    "CommitReceipt",
    "ContextBudget",
    "Decision",
    "DeliveryState",
    "DriverInput",
    "DriverStep",
    "DriverTurn",
    "Event",
    "EventKind",
    "Host",
    "IfBusy",
    "Limits",
    "ModelReply",
    "ModelRequest",
    "Policy",
    "PrefixSnapshot",
    "PruneReport",
    "PrunedSession",
    "Refusal",
    "Session",
    "SessionDriver",
    "SessionHooks",
    "SessionStateView",
    "StreamAborted",
    "TaskContract",
    "ToolContext",
    "TurnHandle",
    "TurnOptions",
    "TurnOutcome",
    "TurnPreparation",
    "TurnRecord",
    "TurnRequest",
    "TurnResult",
    "TurnStatus",
    "TurnStopped",
    "Usage",
    "WebhookDelivery",
    "connect",
    "errors",
    "estimate_tokens",
    "load_host",
    "models",
    "tool",
    "tools",
    "transcript",
]

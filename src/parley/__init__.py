"""parley: durable, streamable, steerable LLM-agent conversations.

``parley.connect()`` opens a client; a client opens or reopens sessions; a session runs
turns (blocking, observed, bounded, or submitted for later) that stream events, take
steers and interrupts, and survive the process that started them.
"""

from parley import errors, models, tools, transcript
from parley.batches import Batch, BatchState
from parley.client import Client, connect
from parley.engine.agent_loop import AgentLoop
from parley.host import Host, load_host
from parley.policy import ApproveAll, AskAlways, Policy
from parley.ports.admission import Limits
from parley.ports.budget import ContextBudget, estimate_tokens
from parley.ports.compaction import Compaction
from parley.ports.driver import DriverInput, DriverStep, DriverTurn, SessionDriver, TurnStopped
from parley.ports.host import (
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
    WaitFor,
)
from parley.schedules import Schedule
from parley.schemas.compactions import CompactionRecord, CompactionStrategy
from parley.schemas.events import Event, EventKind
from parley.schemas.operations import DeliveryState, PrunedSession, PruneReport, WebhookDelivery
from parley.schemas.records import (
    Approval,
    ChildRecord,
    Decision,
    IfBusy,
    TaskContract,
    TurnRecord,
    TurnResult,
    TurnStatus,
    TurnUsage,
    Usage,
)
from parley.schemas.schedules import Overlap, ScheduleRecord, ScheduleRun, SlotStatus
from parley.session import Session
from parley.sub_agents import Agent
from parley.tools.decorator import tool
from parley.turn_handle import TurnHandle

__all__ = [
    "Access",
    "Agent",
    "AgentLoop",
    "Approval",
    "ApprovalRequest",
    "ApproveAll",
    "Ask",
    "AskAlways",
    "Batch",
    "BatchState",
    "ChildRecord",
    "Client",
    "CommitReceipt",
    "Compaction",
    "CompactionRecord",
    "CompactionStrategy",
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
    "Overlap",
    "Policy",
    "PrefixSnapshot",
    "PruneReport",
    "PrunedSession",
    "Refusal",
    "Schedule",
    "ScheduleRecord",
    "ScheduleRun",
    "Session",
    "SessionDriver",
    "SessionHooks",
    "SessionStateView",
    "SlotStatus",
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
    "TurnUsage",
    "Usage",
    "WaitFor",
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

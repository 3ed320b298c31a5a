"""The error hierarchy shared by every layer (re-exported as ``parley.errors``)."""


class ParleyError(Exception):
    """Base of every error parley raises to a caller."""


class SessionNotFound(ParleyError):
    """No session has this id in the store."""


class TurnNotFound(ParleyError):
    """No turn has this id in the store."""


class BatchNotFound(ParleyError):
    """No batch (docs/batches.md) has this id in the store (or another tenant's has)."""


class CompactionNotFound(ParleyError):
    """No compaction of this session has this id (docs/compaction.md)."""


class ScheduleNotFound(ParleyError):
    """No schedule (docs/time.md#schedules) has this id (or another tenant's has)."""


class FileNotFound(ParleyError):
    """No file (an upload, or a batch's output or error file) has this id."""


class TurnEnded(ParleyError):
    """A steer or interrupt was sent to a turn that has already ended."""


class SessionBusy(ParleyError):
    """``if_busy="reject"`` and the session has a queued or running turn."""


class ForeignTurn(ParleyError):
    """The turn belongs to another session than the one the call was made on."""


class InvalidRequest(ParleyError):
    """The input is malformed (empty or oversized prompt, bad arguments, unknown tool …)."""


class CodecError(ParleyError):
    """Stored rows cannot be turned into a valid provider conversation (e.g. an incomplete
    tool round: a tool call without its result)."""


class PrefixFrozen(ParleyError):
    """A hook tried to replace a session's frozen prefix without an explicit refresh."""


class Conflict(ParleyError):
    """The request contradicts the stored state (a reused ``request_id`` with another prompt,
    resuming a turn that is not resumable, …)."""


class StorageFull(ParleyError):
    """A tenant's uploaded files would hold more than its storage quota
    (``PARLEY_TENANT_STORAGE``, docs/security.md): nothing was stored."""


class Fenced(ParleyError):
    """A worker's fencing token is stale: another worker now drives the session, so this one
    must not commit.  Raised inside workers; never reaches an API caller."""


class StoreError(ParleyError):
    """The database failed (unreachable, schema missing, driver error)."""


class WaitTimeout(ParleyError, TimeoutError):
    """``TurnHandle.wait`` ran out of time; the turn goes on."""


class McpError(ParleyError):
    """An MCP server could not be started, reached or initialised, a call to it failed or
    timed out, or it answered a tool call with an error result.  The message names the
    server and the cause."""


class DriverFailed(ParleyError):
    """A host's driver (``Host(driver=...)``) could not finish its turn.  ``partial`` is
    what it had accumulated (text the user may see), kept with the failed turn as a
    display-only partial, never replayed to a model."""

    def __init__(self, message: str, *, partial: str | None = None) -> None:
        super().__init__(message)
        self.partial = partial or None

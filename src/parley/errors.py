"""Every error parley raises to a caller derives from :class:`ParleyError`.

Driver errors (sqlite3, psycopg, redis) are translated at the adapter boundary, so callers
never have to import a driver to handle a failure.  The classes live in ``schemas`` so that
the worker side can raise them without importing the public package; this module is the
public name for them.
"""

from parley.schemas.errors import (
    BatchNotFound,
    CodecError,
    CompactionNotFound,
    Conflict,
    DriverFailed,
    Fenced,
    FileNotFound,
    ForeignTurn,
    InvalidRequest,
    McpError,
    ParleyError,
    PrefixFrozen,
    ScheduleNotFound,
    SessionBusy,
    SessionNotFound,
    StorageFull,
    StoreError,
    TurnEnded,
    TurnNotFound,
    WaitTimeout,
)

__all__ = [
    "BatchNotFound",
    "CodecError",
    "CompactionNotFound",
    "Conflict",
    "DriverFailed",
    "Fenced",
    "FileNotFound",
    "ForeignTurn",
    "InvalidRequest",
    "McpError",
    "ParleyError",
    "PrefixFrozen",
    "ScheduleNotFound",
    "SessionBusy",
    "SessionNotFound",
    "StorageFull",
    "StoreError",
    "TurnEnded",
    "TurnNotFound",
    "WaitTimeout",
]

"""A turn's tree as Server-Sent Events (docs/sub-agents.md#one-stream-for-the-tree):
``GET /v1/turns/{id}/events?children=1``.  Each frame is ``id: CURSOR``, ``event: KIND``,
``data: Event`` with the event's ``path``; a reader that reconnects with the last
``Last-Event-ID`` gets every later event of the tree once.

The tree is read from the shared feeds (:mod:`parley.gateway.tree_feed`, a task per turn
of the tree, no thread), with the cursors the Python client's tree stream gives
(:mod:`parley.tree_stream`).
"""

from __future__ import annotations

import json

from sse_starlette import ServerSentEvent

from parley.gateway.event_streams import SSE_LINE_END
from parley.tree_stream import TreeEvent


def tree_sse_bytes(event: TreeEvent) -> bytes:
    """A tree event's SSE frame: its cursor as the id, its path in the data."""
    data = {**event.to_json(), "path": [dict(step) for step in event.path]}
    frame = ServerSentEvent(
        data=json.dumps(data, separators=(",", ":")),
        event=str(event.kind),
        id=event.cursor,
        sep=SSE_LINE_END,
    )
    return frame.encode()

"""One turn under a fencing token: its boundaries, steps, tool calls, approvals and
commits, the context it replays, and the turn a driver (the host's agent loop) is handed.
Talks to the store and the coordinator only through :mod:`parley.ports`."""

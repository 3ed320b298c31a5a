"""parley's runtime core: what runs a turn, below the client and the gateway.

Six layers, each a sub-package, each importing only those under it (an import contract
in ``pyproject.toml``, checked by ``lint-imports`` in CI):

- :mod:`workers.runtime`: a fleet process's part: the session drainer (holds a session's
  lock and runs its turns in order), the Celery tasks' bodies, leases, concurrency;
- :mod:`workers.engine`: one turn under a fencing token, step by step, and what a driver
  (the host's agent loop) is handed;
- :mod:`workers.store`: all durable state, every SQL statement named in one catalogue;
- :mod:`workers.coordination`: locks, fencing, deltas and steer lists in Redis (Lua
  scripts) and in process, every key and timing;
- :mod:`workers.telemetry`: metrics and the ids a log line is about;
- :mod:`workers.ports`: the contracts a host author and a back end implement.

Nothing here imports :mod:`parley`; the engine imports no Celery, Redis, SQLAlchemy or
HTTP client.
"""

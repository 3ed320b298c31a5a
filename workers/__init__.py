"""What runs a turn: the engine (step loop), the store (all SQL), coordination (lock,
fencing, deltas, steer signals) in a Redis and an in-process implementation, the driver
that runs a session's turns in order, and the Celery tasks.

The engine imports no Celery, Redis, SQLAlchemy or HTTP client: it talks to the narrow
ports of :mod:`workers.host_ports` and :mod:`workers.backend_ports`.
"""

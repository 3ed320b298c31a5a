"""A fleet process's part: the session drainer that holds a session's lock and runs its
turns in order, what the Celery tasks do (without Celery), the embedded deployment's
session leases, and how many turns one process drives at once."""

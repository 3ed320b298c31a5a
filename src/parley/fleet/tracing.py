"""Celery's own spans, when an operator wants them beside parley's (``PARLEY_TRACE_CELERY=1``
with tracing on, docs/operations.md#traces): OpenTelemetry's Celery instrumentation, in
producers (a kick's publish span) and in workers (its run span).

They nest in the turn's trace rather than fork one of their own: a submission sends its
kick inside its ``parley.submit`` span, so the publish span, and the worker's run span
under it, are in the caller's trace; the worker's ``invoke_agent`` span still hangs under
the submission stored with the run (whoever kicked) and links the run span that started
it.  A kick from the sweeper, a hand-over or a kick when capacity is due makes a trace of
its own (:func:`apart_from_the_current_trace`), linked the same way.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager

from parley.fleet.settings import FleetSettings
from parley.telemetry import tracing

_lock = threading.Lock()
_instrumented = False


def instrument_celery(settings: FleetSettings) -> None:
    """Instrument Celery in this process, once, if ``settings`` ask for its spans and
    tracing is on.  (In a prefork worker's main process, before the pool forks: the
    children inherit the signal handlers, and the SDK restarts its export thread in
    each.)"""
    global _instrumented
    if not settings.trace_celery or tracing.tracer() is None:
        return
    with _lock:
        if _instrumented:
            return
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()  # type: ignore[no-untyped-call]
        _instrumented = True


def apart_from_the_current_trace() -> AbstractContextManager[None]:
    """For a kick a worker sends (a hand-over, a kick when capacity is due): its publish
    span starts a trace of its own rather than join the trace of the task sending it,
    which is another turn's."""
    if not _instrumented:
        return tracing.attached(None)
    return tracing.attached(tracing.new_root())

"""Exemplars: the latency histograms' buckets name the trace of a turn that fell in them
(docs/operations.md#traces), so a slow bucket on a dashboard opens the slow turn's trace.

Recorded only while a sampled span is current (tracing on).  prometheus_client keeps a
bucket's latest exemplar itself, but not in its multiprocess mode (a Celery worker's
processes count in files, and its values there have no exemplars): there each process
also writes its buckets' latest exemplars to ``exemplars_<pid>.json`` beside its value
files, and the serving process attaches the newest one of each bucket to the summed
samples.  Exemplars appear in the OpenMetrics exposition only (a scraper asks for it:
Prometheus with ``--enable-feature=exemplar-storage``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from parley.telemetry import tracing

MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
_PREFIX = "exemplars_"

FLUSH_SECONDS = 1.0
"""How often at most a process writes its exemplar file (a bucket's exemplar is at most
this much older in the served metrics than in the process)."""

_lock = threading.Lock()
_latest: dict[str, list[Any]] = {}  # "name|labels|le" -> [trace id, value, time]
_pending: threading.Timer | None = None


def current() -> dict[str, str] | None:
    """The exemplar of an observation made here, now: the current trace's id, if any."""
    trace_id = tracing.trace_id()
    return None if trace_id is None else {"trace_id": trace_id}


def observe(
    child: Any, name: str, labels: dict[str, str], buckets: Sequence[float], value: float
) -> None:
    """``child.observe(value)`` with the current trace as its exemplar; in multiprocess
    mode, also kept in this process's exemplar file."""
    exemplar = current()
    child.observe(value, exemplar=exemplar)
    if exemplar is None:
        return  # tracing off: nothing more on this path
    directory = os.environ.get(MULTIPROC_VARIABLE)
    if not directory:
        return
    bound = next((b for b in buckets if value <= b), math.inf)
    key = f"{name}|{json.dumps(labels, sort_keys=True)}|{_le(bound)}"
    global _pending
    with _lock:
        _latest[key] = [exemplar["trace_id"], value, time.time()]
        if _pending is None:
            # Written at most once a FLUSH_SECONDS, not at every observation.
            _pending = threading.Timer(FLUSH_SECONDS, flush, args=(directory,))
            _pending.daemon = True
            _pending.start()


def flush(directory: str) -> None:
    """Write this process's latest exemplars now (what its timer does)."""
    global _pending
    with _lock:
        if _pending is not None:
            _pending.cancel()
            _pending = None
        if not _latest:
            return
        path = os.path.join(directory, f"{_PREFIX}{os.getpid()}.json")
        # Replaced whole: a reader never sees half of one.
        with open(f"{path}.tmp", "w") as out:
            json.dump(_latest, out)
        os.replace(f"{path}.tmp", path)


def _forget_the_parents() -> None:
    """In a forked child: the parent's exemplars and timer are not this process's."""
    global _pending, _lock
    _lock = threading.Lock()
    _latest.clear()
    _pending = None


os.register_at_fork(after_in_child=_forget_the_parents)


def files(directory: str) -> list[str]:
    """The exemplar files in ``directory`` (an earlier run's, at a worker's start)."""
    return glob.glob(os.path.join(directory, f"{_PREFIX}*.json"))


def forget(pid: int, directory: str) -> None:
    """A process that is gone: its exemplars go with its gauges."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, f"{_PREFIX}{pid}.json"))


def attach(metrics: Iterable[Any], directory: str) -> list[Any]:
    """``metrics`` (a multiprocess collector's) with each histogram bucket's newest
    exemplar from every process's file."""
    from prometheus_client.samples import Exemplar

    flush(directory)  # (a process that serves what it counts: its own, first)
    newest = _newest(directory)
    collected = list(metrics)
    if not newest:
        return collected
    for metric in collected:
        if metric.type != "histogram":
            continue
        bucket = metric.name + "_bucket"
        for i, sample in enumerate(metric.samples):
            if sample.name != bucket:
                continue
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            key = f"{metric.name}|{json.dumps(labels, sort_keys=True)}|{sample.labels['le']}"
            seen = newest.get(key)
            if seen is not None:
                exemplar = Exemplar({"trace_id": seen[0]}, seen[1], seen[2])
                metric.samples[i] = sample._replace(exemplar=exemplar)
    return collected


def _newest(directory: str) -> dict[str, list[Any]]:
    """Each bucket's newest exemplar over every process's file."""
    newest: dict[str, list[Any]] = {}
    for path in files(directory):
        try:
            with open(path) as found:
                kept = json.load(found)
        except (OSError, ValueError):
            continue  # (a process being forgotten)
        for key, seen in kept.items():
            if key not in newest or seen[2] > newest[key][2]:
                newest[key] = seen
    return newest


def _le(bound: float) -> str:
    """A bucket's ``le`` label as prometheus_client writes it."""
    from prometheus_client.utils import floatToGoString

    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]

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

from workers.telemetry import tracing

MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
_PREFIX = "exemplars_"

_lock = threading.Lock()
_latest: dict[str, list[Any]] = {}  # "name|labels|le" -> [trace id, value, time]


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
    directory = os.environ.get(MULTIPROC_VARIABLE)
    if exemplar is None or not directory:
        return
    bound = next((b for b in buckets if value <= b), math.inf)
    key = f"{name}|{json.dumps(labels, sort_keys=True)}|{_le(bound)}"
    with _lock:
        _latest[key] = [exemplar["trace_id"], value, time.time()]
        _write(directory, dict(_latest))


def _write(directory: str, latest: dict[str, list[Any]]) -> None:
    """Replace this process's file whole (a reader never sees half of one)."""
    path = os.path.join(directory, f"{_PREFIX}{os.getpid()}.json")
    partial = f"{path}.{threading.get_ident()}.tmp"
    with open(partial, "w") as out:
        json.dump(latest, out)
    os.replace(partial, path)


def forget(pid: int, directory: str) -> None:
    """A process that is gone: its exemplars go with its gauges."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, f"{_PREFIX}{pid}.json"))


def attach(metrics: Iterable[Any], directory: str) -> list[Any]:
    """``metrics`` (a multiprocess collector's) with each histogram bucket's newest
    exemplar from every process's file."""
    from prometheus_client.samples import Exemplar

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
    for path in glob.glob(os.path.join(directory, f"{_PREFIX}*.json")):
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

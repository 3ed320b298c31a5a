"""Serving the metrics of :mod:`parley.telemetry.metrics`: a worker's or the sweeper's HTTP port
(``PARLEY_METRICS_PORT``), and the body of the gateway's ``GET /metrics``.

A Celery worker on the prefork pool runs its turns in child processes, so its counts
live in files, one set per process, under ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's
multiprocess mode), and its main process serves their sum on one port.  The worker sets
that directory up in its main process before the pool forks (:func:`serve_worker`): the
one named by ``PROMETHEUS_MULTIPROC_DIR``, emptied of an earlier run's files, or a
temporary one of its own, removed when it stops.  The same mode serves the threads and
solo pools, whose turns run in the main process.  The sweeper is one process and
counts in memory.
"""

from __future__ import annotations

import atexit
import glob
import importlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from parley.errors import InvalidRequest
from parley.settings import Settings
from parley.telemetry import exemplars, metrics
from parley.telemetry.metrics import instruments

log = logging.getLogger("parley.metrics")

PORT_VARIABLE = "PARLEY_METRICS_PORT"
MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
DEFAULT_ADDRESS = "0.0.0.0"


@dataclass(frozen=True, kw_only=True)
class MetricsBind:
    """Where a fleet process serves its metrics."""

    host: str
    port: int

    @classmethod
    def from_settings(cls, settings: Settings) -> MetricsBind | None:
        """``PARLEY_METRICS_PORT``: ``PORT`` (every interface) or ``HOST:PORT``; None when
        unset.  :class:`InvalidRequest` for anything else."""
        value = settings.metrics_port
        if not value:
            return None
        host, colon, port = value.rpartition(":")
        if not colon:
            host = DEFAULT_ADDRESS
        host = host.removeprefix("[").removesuffix("]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidRequest(
                f"{PORT_VARIABLE} must be PORT or HOST:PORT with a port from 1 to 65535, "
                f"not {value!r}"
            )
        return cls(host=host, port=int(port))


@dataclass
class _Served:
    """What this process set up to serve metrics (to undo at its end)."""

    server: Any = None
    made_directory: str | None = None
    owner: int = 0


_served = _Served()


def serve_worker(bind: MetricsBind) -> None:
    """In a Celery worker's main process, before its pool starts: count in files under a
    directory every pool process shares, and serve their sum on ``bind``.  A port that
    cannot be bound is logged, never fatal: the worker runs its turns regardless."""
    directory = os.environ.get(MULTIPROC_VARIABLE)
    if directory:
        os.makedirs(directory, exist_ok=True)
        # An earlier run's files would count again (prometheus_client asks for the
        # directory to be emptied between runs): only its own, *.db, are removed, and
        # parley's exemplar files.
        for stale in glob.glob(os.path.join(directory, "*.db")) + exemplars.files(directory):
            os.remove(stale)
    else:
        directory = tempfile.mkdtemp(prefix="parley-metrics-")
        os.environ[MULTIPROC_VARIABLE] = directory
        _served.made_directory = directory
        atexit.register(stop_worker)
    _served.owner = os.getpid()
    values: Any = importlib.import_module("prometheus_client.values")
    if not _counts_in_files(values):
        # prometheus_client was imported before the directory was set (the celery
        # command imports its plugins' commands as it starts, and Flower's imports the
        # library), so it keeps values in memory.  It makes each value with its
        # ``values.ValueClass`` as a metric is made, and parley's are made on first use:
        # from now on, in files.
        values.ValueClass = values.MultiProcessValue()
    if metrics.built():
        log.warning(
            "this worker counted before it chose %s: those counts are not served",
            MULTIPROC_VARIABLE,
        )
    _start(bind, _multiprocess_registry(directory))


def serve_process(bind: MetricsBind) -> None:
    """In a process of its own (the sweeper): serve its own metrics, counted in memory,
    on ``bind``.  (It leaves ``PROMETHEUS_MULTIPROC_DIR`` aside: a worker on the same
    machine with the same directory would count the sweeper's numbers as its own.)"""
    if "prometheus_client" not in sys.modules:
        os.environ.pop(MULTIPROC_VARIABLE, None)
    import prometheus_client

    _start(bind, prometheus_client.REGISTRY)


def forget_server() -> None:
    """In a pool process just forked from the worker: close its copy of the metrics
    server's socket, so that the port is the main process's alone."""
    server = _served.server
    if server is not None and os.getpid() != _served.owner:
        server.socket.close()
        _served.server = None


def process_exited() -> None:
    """In a pool process that is exiting: its live gauges (turns in flight) stop
    counting.  (One killed without this is pruned at the next scrape.)"""
    directory = os.environ.get(MULTIPROC_VARIABLE)
    if directory and os.getpid() != _served.owner:
        _multiprocess().mark_process_dead(os.getpid(), directory)
        exemplars.forget(os.getpid(), directory)


def stop_worker() -> None:
    """In the worker's main process, as it stops: stop serving and remove the
    temporary directory it made, if it made one."""
    if os.getpid() != _served.owner:
        return  # a pool process inherited the hook: the directory is the worker's
    if _served.server is not None:
        _served.server.shutdown()
        _served.server.server_close()
        _served.server = None
    if _served.made_directory is not None:
        shutil.rmtree(_served.made_directory, ignore_errors=True)
        _served.made_directory = None


def exposition(accept: str | None = None) -> tuple[bytes, str]:
    """This process's metrics (with ``PROMETHEUS_MULTIPROC_DIR`` set: the sum over every
    process counting there) in the format a scraper's ``Accept`` header asks for, as
    prometheus_client's own server chooses it (Prometheus's text format unless
    OpenMetrics is asked for), and its content type."""
    import prometheus_client
    from prometheus_client.exposition import choose_encoder

    instruments()  # every metric is listed from the first scrape on, at zero
    directory = os.environ.get(MULTIPROC_VARIABLE)
    registry = _multiprocess_registry(directory) if directory else prometheus_client.REGISTRY
    encode, content_type = choose_encoder(accept or "")
    return encode(registry), content_type


def _start(bind: MetricsBind, registry: Any) -> None:
    import prometheus_client

    instruments()
    try:
        server, _thread = prometheus_client.start_http_server(
            bind.port, addr=bind.host, registry=registry
        )
    except OSError as exc:
        log.warning(
            "cannot serve metrics on %s:%d (%s); running without them",
            bind.host,
            bind.port,
            exc.strerror or exc,
        )
        return
    _served.server = server
    log.info("serving metrics on http://%s:%d/metrics", bind.host, bind.port)


def _counts_in_files(values: Any) -> bool:
    """Whether prometheus_client's values (its ``values`` module) are kept in files."""
    return getattr(values.ValueClass, "__name__", "") == "MmapedValue"


class _LiveProcesses:
    """The multiprocess collector over ``directory``, which first forgets the live
    gauges of pool processes that died without saying so (SIGKILL, the OOM killer):
    their turns are no longer in flight."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._collector = _multiprocess().MultiProcessCollector(None, directory)

    def collect(self) -> Iterable[Any]:
        for path in glob.glob(os.path.join(self._directory, "gauge_live*_*.db")):
            pid = os.path.basename(path).rsplit("_", 1)[-1].removesuffix(".db")
            if pid.isdigit() and not _alive(int(pid)):
                _multiprocess().mark_process_dead(int(pid), self._directory)
                exemplars.forget(int(pid), self._directory)
        return exemplars.attach(self._collector.collect(), self._directory)


def _multiprocess() -> Any:
    """prometheus_client's multiprocess module (untyped), imported when first needed."""
    return importlib.import_module("prometheus_client.multiprocess")


def _multiprocess_registry(directory: str) -> Any:
    import prometheus_client

    registry = prometheus_client.CollectorRegistry()
    registry.register(_LiveProcesses(directory))
    return registry


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True

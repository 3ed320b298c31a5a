"""The memory of each of the soak's processes over the run: sampled every few seconds by
role, so a process restarted by a fault starts a new series under the same role."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from tests.soak.topology import Topology, rss_of

SAMPLE_SECONDS = 5.0


@dataclass(frozen=True)
class Sample:
    at: float
    """Seconds since sampling began."""
    role: str
    pid: int
    rss: int


@dataclass
class MemorySampler:
    topology: Topology
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="soak-memory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._sample(time.monotonic() - self._began)

    def _run(self) -> None:
        self._began = time.monotonic()
        while True:
            self._sample(time.monotonic() - self._began)
            if self._stop.wait(SAMPLE_SECONDS):
                return

    def _sample(self, at: float) -> None:
        for role, pid in self.topology.processes().items():
            rss = rss_of(pid)
            if rss:  # (none, or 0 for a process that died and was not reaped yet)
                self.samples.append(Sample(at, role, pid, rss))

    def by_role(self) -> dict[str, dict[str, float]]:
        """For each role: its RSS (MiB) at the start and the end, and for its longest-lived
        process, how long it lived and its RSS first and last (what "flat" is judged on)."""
        roles: dict[str, dict[str, float]] = {}
        for role in sorted({s.role for s in self.samples}):
            series = [s for s in self.samples if s.role == role]
            by_pid: dict[int, list[Sample]] = {}
            for sample in series:
                by_pid.setdefault(sample.pid, []).append(sample)
            longest = max(by_pid.values(), key=lambda s: s[-1].at - s[0].at)
            # The first sample of a process is taken as it starts: judge "flat" from a
            # minute in (or its second sample), once it has served some load.
            warm = next(
                (s for s in longest if s.at - longest[0].at >= 60),
                longest[min(1, len(longest) - 1)],
            )
            roles[role] = {
                "start_mib": series[0].rss / 2**20,
                "end_mib": series[-1].rss / 2**20,
                "processes": len(by_pid),
                "longest_seconds": longest[-1].at - longest[0].at,
                "longest_warm_mib": warm.rss / 2**20,
                "longest_end_mib": longest[-1].rss / 2**20,
            }
        return roles

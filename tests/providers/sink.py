"""A DeltaSink for the provider tests: records every delta and restart, in order."""

from __future__ import annotations

import threading
from collections.abc import Callable

from parley.ports.admission import ProviderReport
from parley.ports.host import StreamAborted


class RecordingSink:
    """Records ``("delta", text)`` and ``("restart", reason)`` in ``log``, and the
    provider's reports in ``reports``.  ``on_delta``
    runs on each delta (e.g. to open a server's gate); ``abort_after`` raises
    :class:`StreamAborted` on that many deltas, like an interrupt mid-stream."""

    def __init__(
        self,
        *,
        on_delta: Callable[[str], None] | None = None,
        abort_after: int | None = None,
    ) -> None:
        self.log: list[tuple[str, str]] = []
        self._on_delta = on_delta
        self._abort_after = abort_after
        self.first_delta = threading.Event()
        self.interrupted = threading.Event()  # set it to interrupt the turn
        self.checks = 0
        self.reports: list[tuple[ProviderReport, int]] = []
        """Each report, with how many deltas had come before it."""

    def __call__(self, text: str) -> None:
        self.log.append(("delta", text))
        self.first_delta.set()
        if self._on_delta is not None:
            self._on_delta(text)
        if self._abort_after is not None and len(self.deltas) >= self._abort_after:
            raise StreamAborted

    def restart(self, reason: str) -> None:
        self.log.append(("restart", reason))
        self.raise_if_interrupted()

    def provider_report(self, report: ProviderReport) -> None:
        self.reports.append((report, len(self.deltas)))

    def raise_if_interrupted(self) -> None:
        self.checks += 1
        if self.interrupted.is_set():
            raise StreamAborted

    @property
    def deltas(self) -> list[str]:
        """Every delta, across restarts."""
        return [text for kind, text in self.log if kind == "delta"]

    @property
    def restarts(self) -> list[str]:
        """The reasons of every restart."""
        return [text for kind, text in self.log if kind == "restart"]

    @property
    def text(self) -> str:
        """What a reader shows: the deltas since the last restart."""
        current: list[str] = []
        for kind, text in self.log:
            current = [] if kind == "restart" else [*current, text]
        return "".join(current)

"""The admission benchmark's tenants (tests/bench/admission.py): two tenants weighted 3:1
whose batch backlogs wait together, and a tenant that calls all its work interactive
beside another's batch and interactive turns (issue 43).  Each tenant's calls are counted
from the steps' commit times in the store, over the time both had turns waiting."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg

from tests.bench.admission_fleet import (
    PROBE_LEAD_SECONDS,
    Options,
    Prober,
    failures,
    running_fleet,
    submit_all,
)
from tests.providers.rate_limited_server import ServerProcess

WEIGHTS = {"big": 3, "small": 1}
WINDOW_MARGIN_SECONDS = 1.0
"""Cut from each end of the window in which both tenants had turns waiting: its first
second is the backlogs' first calls, its last the calls in flight as one ran out."""


@dataclass(frozen=True, kw_only=True)
class TenantRun:
    """The calls each tenant got while both had batch turns waiting."""

    big: int
    small: int
    window: float
    failed: int

    @property
    def ratio(self) -> float:
        return self.big / max(1, self.small)

    def figures(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "target": WEIGHTS["big"] / WEIGHTS["small"]}


@dataclass(frozen=True, kw_only=True)
class FloodRun:
    """A tenant's interactive backlog beside another tenant's batch and probes."""

    flood: int
    """The flooding tenant's calls while both had turns waiting."""
    other: int
    """The other tenant's batch calls meanwhile."""
    window: float
    first_token: list[float]
    """The other tenant's interactive probes, submit to first token, in the flood."""
    probes_without_token: int
    failed: int

    @property
    def ratio(self) -> float:
        return self.flood / max(1, self.other)

    def figures(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "target": 1.0}


def tenant_run(server: ServerProcess, options: Options) -> TenantRun:
    """Part 2: both tenants' backlogs submitted at once; the calls each got while both
    still had turns waiting, counted from the steps' commit times in the store."""
    weights = ",".join(f"{tenant}={weight}" for tenant, weight in WEIGHTS.items())
    environment = {"PARLEY_TENANT_WEIGHTS": weights}
    with running_fleet(server, options, environment) as (fleet, client, root):
        big = options.tenant_turns * 3 // 5
        counts = {"big": big, "small": options.tenant_turns - big}
        with ThreadPoolExecutor(8) as openers:
            sessions = {
                tenant: list(
                    openers.map(
                        lambda _, t=tenant: client.open_session(root, tenant=t), range(count)
                    )
                )
                for tenant, count in counts.items()
            }
        with ThreadPoolExecutor(2) as tenants:
            submitted = list(tenants.map(lambda t: submit_all(sessions[t], t), counts))
        failed = sum(failures(handles) for handles in submitted)
        commits = step_commits(fleet.database_url, tuple(WEIGHTS))
    big, small, window = shares(commits)
    return TenantRun(big=big, small=small, window=window, failed=failed)


def step_commits(database_url: str, tenants: tuple[str, ...]) -> dict[str, list[datetime]]:
    """Each of ``tenants``' step commit times (a turn here is one step: one call), its
    batch turns' and interactive ones' alike."""
    sql = """
        SELECT s.tenant, st.created_at FROM steps st
        JOIN runs r ON r.id = st.run_id JOIN sessions s ON s.id = r.session_id
        WHERE s.tenant IS NOT NULL
    """
    commits: dict[str, list[datetime]] = {tenant: [] for tenant in tenants}
    with psycopg.connect(database_url.replace("+psycopg", "")) as db:
        for tenant, at in db.execute(sql):
            if tenant in commits:
                commits[tenant].append(at)
    return commits


def shares(commits: dict[str, list[datetime]]) -> tuple[int, int, float]:
    """The calls of each of the two tenants (in ``commits``' order) committed while both
    had turns waiting, from the first commit to the first tenant's last (each with a
    margin cut off), and that window's seconds."""
    begins = min(min(times) for times in commits.values())
    ends = min(max(times) for times in commits.values())
    low = begins.timestamp() + WINDOW_MARGIN_SECONDS
    high = ends.timestamp() - WINDOW_MARGIN_SECONDS
    first, second = (
        sum(low <= at.timestamp() <= high for at in times) for times in commits.values()
    )
    return first, second, high - low


def flood_run(server: ServerProcess, options: Options) -> FloodRun:
    """Part 4: tenant ``flood`` submits ``flood_turns`` interactive turns while tenant
    ``other`` submits half as many batch turns, and probes as ``other`` through them: its
    first tokens, and each tenant's calls while both wait (equal weights: 1:1)."""
    with running_fleet(server, options, {}) as (fleet, client, root):
        with ThreadPoolExecutor(8) as openers:
            flood = list(
                openers.map(
                    lambda _: client.open_session(root, tenant="flood"), range(options.flood_turns)
                )
            )
            other = list(
                openers.map(
                    lambda _: client.open_session(root, tenant="other"),
                    range(options.flood_turns // 2),
                )
            )
        span = max(1.0, 0.8 * options.flood_turns / options.rate - PROBE_LEAD_SECONDS)
        prober = Prober(client, root, options.probes, span, tenant="other")
        server.reset_stats()
        prober.start(time.perf_counter())
        with ThreadPoolExecutor(2) as tenants:
            floods = tenants.submit(submit_all, flood, "flood", "interactive")
            others = tenants.submit(submit_all, other, "other")
            handles = floods.result() + others.result()
        failed = failures(handles)
        busy, without = prober.results()
        commits = step_commits(fleet.database_url, ("flood", "other"))
    flooded, waited, window = shares(commits)
    return FloodRun(
        flood=flooded,
        other=waited,
        window=window,
        first_token=busy,
        probes_without_token=without,
        failed=failed,
    )

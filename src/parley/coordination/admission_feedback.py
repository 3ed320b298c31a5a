"""What the provider said after a grant, folded into one model's
:class:`~parley.coordination.admission_math.ModelState`: the tokens a call really used
(``settle``), the buckets its answer reported left (``observe``), a 429 (``penalise``) and
the limits it stated (``learn``).  Pure functions over the state and a time ``now``, as
the grant arithmetic is; ``lua/admission.lua`` mirrors them (each names its Lua twin)."""

from __future__ import annotations

from parley.coordination.admission_math import (
    MIN_SLOW,
    ModelState,
    faded,
    refill,
    slowness,
)
from parley.ports.admission import Limits, ProviderReport


def settle(state: ModelState, reserved: int, used: int, now: float) -> None:
    """A granted call reserved ``reserved`` tokens and used ``used`` (Lua: settle)."""
    if reserved == 0 or state.tpm is None or state.at is None:
        return  # nothing was reserved, or the state that held it was flushed
    shape = refill(state, now)
    if state.t_level is not None and shape.t_burst is not None:
        state.t_level = min(shape.t_burst, state.t_level + reserved - used)


def observe(
    state: ModelState,
    report: ProviderReport,
    requests_mark: float,
    tokens_mark: float,
    now: float,
) -> None:
    """The provider answered a call granted at the marks, saying what its buckets had
    left: ours hold no more than that, less what was granted after the call (Lua:
    observe)."""
    if state.at is None:
        return  # the state that granted the call was flushed
    refill(state, now)
    if report.requests_remaining is not None and state.r_level is not None:
        ahead = max(0.0, state.r_granted - requests_mark)
        state.r_level = min(state.r_level, report.requests_remaining - ahead)
    if report.tokens_remaining is not None and state.t_level is not None:
        ahead = max(0.0, state.t_granted - tokens_mark)
        state.t_level = min(state.t_level, report.tokens_remaining - ahead)


def penalise(state: ModelState, retry_after: float, now: float) -> None:
    """A 429 came: block the model for ``retry_after``, empty its buckets, and slow it by
    the share of its recent calls refused after the first (Lua: penalise)."""
    refill(state, now)
    faded(state, now)
    state.refusals += 1
    cut = (state.refusals - 1) / max(1.0, state.calls)
    state.slow = max(MIN_SLOW, min(slowness(state, now), 1 - cut))
    state.slowed_at = now
    state.blocked_until = max(state.blocked_until, now + retry_after)
    # (A model with no limit in force yet is emptied too: its first limits find it so.)
    state.r_level = min(state.r_level if state.r_level is not None else 0.0, 0.0)
    state.t_level = min(state.t_level if state.t_level is not None else 0.0, 0.0)
    # Empty until the block ends: a bucket refilled meanwhile would let every waiter of
    # the fleet through at once the moment it ends, the storm that earned the 429.
    state.at = max(state.at or now, state.blocked_until)


def learn(state: ModelState, reported: Limits) -> None:
    """Keep the limits the provider reported (a None one leaves that one as it was) (Lua:
    learn)."""
    if reported.rpm is not None:
        state.learned_rpm = reported.rpm
    if reported.tpm is not None:
        state.learned_tpm = reported.tpm

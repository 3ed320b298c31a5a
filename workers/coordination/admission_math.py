"""The admission arithmetic, written once: pure functions over one model's
:class:`ModelState` and a time ``now`` in seconds.  :mod:`.local_admission` runs them
under a lock; ``lua/admission.lua`` mirrors them line by line (each function here names
its Lua twin), so the Redis and the in-process admissions give the same answers.

Two buckets per model, refilled continuously
--------------------------------------------
The limits in force are, field by field, those the caller configures (``acquire``'s
``configured``), else those the provider reported (``learn``): a model configured with
``rpm`` alone still honours a ``tpm`` its provider stated.  With neither known, a call
is granted at once with no tokens reserved (unless a 429's penalty blocks the model).

- rates: ``r_rate = rpm/60 * HEADROOM * slow`` requests a second, ``t_rate = tpm/60 *
  HEADROOM * slow`` tokens a second (``slow`` is 1 unless 429s came, see below);
- bursts (bucket capacities): BURST_SECONDS of the unslowed rate, at least one request;
- a new model (or one whose state was flushed) starts with full buckets;
- each call refills lazily: ``level = min(burst, level + rate * (now - last))``;
- the token condition is ``t_level >= min(tokens, t_burst)``, then ``t_level -= tokens``:
  a demand larger than the whole bucket is let through a full bucket and leaves a debt
  (a negative level) that later calls wait out.

Lanes.  An ``interactive`` call is granted when ``r_level >= 1`` and the token condition
holds.  Denied, it is told the time until both hold at the current rates, and batch calls
step aside until that wait ends plus INTERACTIVE_GRACE_SECONDS.  A ``batch`` call leaves
a reserve for interactive ones: it needs ``r_level >= 1 + R_RESERVE`` (``R_RESERVE =
max(1, RESERVE_FRACTION * r_burst)``) and ``t_level >= tokens + T_RESERVE`` (``T_RESERVE
= RESERVE_FRACTION * t_burst``), each capped at its bucket's burst (a bucket smaller than
its reserve would otherwise never admit a batch call: with ``rpm`` under 127 the request
burst is below 2), and no interactive call waiting.

Tenants.  Two rules share what interactive calls leave among the tenants with batch
calls waiting (a tenant waits while its ticket clock is later than ``now -
TENANT_IDLE_SECONDS``), in proportion to their weights:

- who is granted: each waiting tenant has a virtual service, ``served += cost / weight``
  per grant, where ``cost = max(1/r_rate, tokens/t_rate)`` is the capacity the call took
  in seconds of the rate (a limit not in force counts 0); a tenant whose service is
  ahead of the least served other waiting tenant is out of its turn and waits, unless
  every bucket is full (capacity would go unused).  A tenant that starts waiting starts
  at that least service: it banks no credit for the time it did not ask;
- when a denied call comes back: a ticket on its tenant's clock, ``share = weight / (sum
  of the weights of the tenants waiting, its own included)``, ``spacing = cost / share``,
  ``ticket = max(clock, now + wait)`` (``wait`` at least one spacing for a call out of
  its turn), ``clock = ticket + spacing``, and the call waits ``ticket - now``.  A batch
  call granted while every bucket is full sets its tenant's clock to now: the tickets of
  waiters that gave up must not push later ones out.

The tickets alone are not enough: a tenant that waited alone was given tickets at the
whole rate, and until they are used its waiters would take every unit of capacity the
moment it refills, before a tenant that arrived after them (whose first ten calls then
waited some 25 s behind a backlog of 1,000 at 1,200 rpm, in the unit tests' simulation).
The turn rule keeps a late tenant's share from its first call; the tickets keep the
waiters of each tenant coming back at about its share, so that few calls are refused
twice.  Two tenants 3:1 that both wait are granted 3:1, whenever each arrived.  A
tenant whose waiters all gave up (a cancelled batch) counts as waiting until its clock
passes: meanwhile the others are granted only when the buckets are full, which still
admits about the whole rate.

Settling.  ``settle`` adds ``reserved - used`` to the token level (capped at the burst; a
debt may take it below zero).  A request, once sent, counts: nothing is given back.

429s.  ``penalise`` halves the model's rate (never below MIN_SLOW of it), blocks every
call of both lanes until ``now + retry_after`` (reason ``penalty``) and empties both
buckets (``level = min(level, 0)``), which refill only from the block's end.  The rate
recovers linearly: ``slow = min(1, slow + (now - slowed_at) / RECOVERY_SECONDS)``.

The over-admission bound
------------------------
Over any window ``[a, b]`` of ``W = b - a`` seconds, with fixed limits:

- the requests granted are at most ``r_burst + rpm/60 * HEADROOM * W``: every grant takes
  one request from a level that is at least 1, the level never exceeds its burst, and it
  refills at no more than the unslowed rate (a penalty only lowers it).  (Plus the rate
  times SLACK_SECONDS, a microsecond: a millionth of a request at 60 a second);
- the tokens charged up to the window's last grant ``g`` (the reservations of the grants
  in ``[a, g]``, plus the excess of the settles in ``[a, g)`` over their reservations,
  minus the refunds they credited) are at most ``t_burst + tpm/60 * HEADROOM * W + max(0,
  tokens_g - t_burst)`` (plus the rate times SLACK_SECONDS): the same argument, where only
  a demand larger than the burst may leave the level below zero.

Both are checked, for any interleaving of acquires, settles, penalties and time, by
tests/unit/test_admission_math.py.  A change of the limits in force resizes the buckets
(the bound holds with the largest).

A FLUSHALL (or a Redis that restarts empty) forgets every model's state: the next call
finds full buckets, so the bound above gains at most one burst of each bucket per flush
(and a debt, a penalty or the tenants' clocks are forgotten with it).  Limits learned
from a provider would be forgotten too; :class:`workers.coordination.redis_admission.RedisAdmission`
keeps a process-local copy of those it saw and restores them into a flushed state with
its next call.

Every time is in seconds on one clock: Redis's ``TIME`` for the fleet, the process's
monotonic clock in process.  A clock that steps back refills nothing (``last`` never
moves backwards).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

from schemas.errors import InvalidRequest
from workers.ports.admission import PRIORITIES, Demand, Grant, Limits, ModelUse, Reason

HEADROOM = 0.95
"""The fraction of a provider's stated limit admitted: the provider's own bucket runs on
its clock, and a call reaches it after our network's jitter; without a margin, a fleet at
the limit meets 429s at every phase slip."""
BURST_SECONDS = 1.0
"""Each bucket holds this many seconds of the unslowed rate (at least one request)."""
RESERVE_FRACTION = 0.1
"""The share of each burst a batch call leaves for interactive ones (at least one
request)."""
INTERACTIVE_GRACE_SECONDS = 0.25
"""How long past a denied interactive call's wait batch calls still step aside: time for
it to come back and take its capacity."""
TENANT_IDLE_SECONDS = 1.0
"""A tenant whose ticket clock is this far in the past has no batch call waiting."""
MIN_SLOW = 0.25
"""The least fraction of its rate a penalised model is admitted at."""
SLOW_FACTOR = 0.5
"""Each 429 multiplies the model's admitted rate by this (multiplicative decrease)."""
RECOVERY_SECONDS = 30.0
"""A slowed model's rate climbs back by the whole rate in this long (linear recovery)."""
SLACK_SECONDS = 1e-6
"""A bucket this close to what a call needs counts as ready: a caller that waited the
wait it was told is not refused by the last bits of a float."""


@dataclass
class ModelState:
    """What admission keeps per model (the fields of its Redis hash, the tickets and
    weights of its zset and weights hash)."""

    r_level: float | None = None
    """Requests in the bucket at ``at`` (None: full, a new or flushed model)."""
    t_level: float | None = None
    at: float | None = None
    """When the levels were last refilled."""
    rpm: int | None = None
    """The limits in force at the latest acquire (settle and penalise refill with them)."""
    tpm: int | None = None
    learned_rpm: int | None = None
    learned_tpm: int | None = None
    slow: float = 1.0
    slowed_at: float = 0.0
    blocked_until: float = 0.0
    interactive_until: float = 0.0
    """Batch calls step aside until then: an interactive call was told to wait."""
    tickets: dict[str, float] = field(default_factory=dict)
    """Each tenant's ticket clock (absolute time): its next batch waiter's turn."""
    weights: dict[str, float] = field(default_factory=dict)
    served: dict[str, float] = field(default_factory=dict)
    """Each waiting tenant's virtual service: the capacity (in seconds of the rate) its
    batch calls were granted, divided by its weight."""


@dataclass(frozen=True)
class Answer:
    """What ``acquire`` decided: the fields of a :class:`~workers.ports.admission.Grant`."""

    granted: bool
    wait: float = 0.0
    tokens: int = 0
    reason: Reason = ""


@dataclass(frozen=True)
class Buckets:
    """The limits in force as rates (per second, slowed) and bursts (None: not limited)."""

    r_rate: float | None
    r_burst: float | None
    t_rate: float | None
    t_burst: float | None


def check_model(model: str) -> None:
    """A model is named by a non-empty string without braces (the name is the hash tag
    of the model's admission keys: workers/coordination/constants.py)."""
    if not isinstance(model, str) or not model:
        raise InvalidRequest(f"admission: model must be a non-empty string, not {model!r}")
    if "{" in model or "}" in model:
        raise InvalidRequest(f"admission: a model's name has no braces, not {model!r}")


def check_demand(demand: Demand) -> None:
    """Refuse a demand the arithmetic cannot weigh, saying what is wrong."""
    check_model(demand.model)
    tokens = demand.tokens
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise InvalidRequest(f"Demand: tokens must be a whole number >= 0, not {tokens!r}")
    if demand.priority not in PRIORITIES:
        raise InvalidRequest(
            f"Demand: priority must be one of {', '.join(PRIORITIES)}, not {demand.priority!r}"
        )
    if not isinstance(demand.tenant, str):
        raise InvalidRequest(f"Demand: tenant must be a string, not {demand.tenant!r}")
    weight = demand.weight
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise InvalidRequest(f"Demand: weight must be a positive number, not {weight!r}")
    if not (weight > 0 and math.isfinite(weight)):
        raise InvalidRequest(f"Demand: weight must be a positive number, not {weight!r}")


def check_seconds(what: str, seconds: float) -> None:
    """A duration must be a finite number >= 0."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidRequest(f"{what} must be a number of seconds >= 0, not {seconds!r}")
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise InvalidRequest(f"{what} must be a number of seconds >= 0, not {seconds!r}")


def check_used(used_tokens: int) -> None:
    """Settled usage is a whole number of tokens."""
    if isinstance(used_tokens, bool) or not isinstance(used_tokens, int) or used_tokens < 0:
        raise InvalidRequest(f"used_tokens must be a whole number >= 0, not {used_tokens!r}")


def learned(state: ModelState) -> Limits | None:
    """The limits the provider reported, if any."""
    if state.learned_rpm is None and state.learned_tpm is None:
        return None
    return Limits(rpm=state.learned_rpm, tpm=state.learned_tpm)


def in_force(state: ModelState, configured: Limits | None) -> tuple[int | None, int | None]:
    """``rpm, tpm`` in force: each configured one, else the one learned (Lua: in_force)."""
    rpm = configured.rpm if configured is not None else None
    tpm = configured.tpm if configured is not None else None
    return (
        rpm if rpm is not None else state.learned_rpm,
        tpm if tpm is not None else state.learned_tpm,
    )


def slowness(state: ModelState, now: float) -> float:
    """The fraction of its rate the model is admitted at now (Lua: slowness)."""
    return min(1.0, state.slow + max(0.0, now - state.slowed_at) / RECOVERY_SECONDS)


def buckets(rpm: int | None, tpm: int | None, slow: float) -> Buckets:
    """Rates and bursts of the limits ``rpm``, ``tpm`` at ``slow`` (Lua: buckets)."""
    r_full = rpm / 60 * HEADROOM if rpm is not None else None
    t_full = tpm / 60 * HEADROOM if tpm is not None else None
    return Buckets(
        r_rate=r_full * slow if r_full is not None else None,
        r_burst=max(1.0, r_full * BURST_SECONDS) if r_full is not None else None,
        t_rate=t_full * slow if t_full is not None else None,
        t_burst=t_full * BURST_SECONDS if t_full is not None else None,
    )


def _refilled(
    level: float | None, rate: float | None, burst: float | None, dt: float
) -> float | None:
    """One bucket's level after ``dt`` seconds (Lua: refilled)."""
    if rate is None or burst is None:
        return None  # not limited: no level to keep
    if level is None:
        return burst  # a new or flushed model starts full
    return min(burst, level + rate * dt)


def refill(state: ModelState, now: float) -> Buckets:
    """Bring both levels to ``now`` at the limits in force; returns the buckets (Lua:
    refill).  ``at`` never moves backwards: a clock that stepped back refills nothing."""
    shape = buckets(state.rpm, state.tpm, slowness(state, now))
    dt = max(0.0, now - state.at) if state.at is not None else 0.0
    state.r_level = _refilled(state.r_level, shape.r_rate, shape.r_burst, dt)
    state.t_level = _refilled(state.t_level, shape.t_rate, shape.t_burst, dt)
    state.at = now if state.at is None else max(state.at, now)
    return shape


def _needs(shape: Buckets, demand: Demand) -> tuple[float, float]:
    """The request and token levels the demand's lane needs (Lua: needs)."""
    r_need, t_need = 1.0, float(demand.tokens)
    if demand.priority == "batch":
        r_need += max(1.0, RESERVE_FRACTION * shape.r_burst) if shape.r_burst is not None else 0
        t_need += RESERVE_FRACTION * shape.t_burst if shape.t_burst is not None else 0
    return (
        min(r_need, shape.r_burst) if shape.r_burst is not None else 0.0,
        min(t_need, shape.t_burst) if shape.t_burst is not None else 0.0,
    )


def _bucket_waits(state: ModelState, shape: Buckets, demand: Demand) -> tuple[float, float]:
    """Seconds until the request and the token level reach what the demand needs, at the
    current rates (0: already there) (Lua: bucket_waits)."""
    r_need, t_need = _needs(shape, demand)
    r_wait = t_wait = 0.0
    if shape.r_rate is not None and state.r_level is not None:
        r_wait = max(0.0, (r_need - state.r_level) / shape.r_rate)
    if shape.t_rate is not None and state.t_level is not None:
        t_wait = max(0.0, (t_need - state.t_level) / shape.t_rate)
    return r_wait, t_wait


def _full(state: ModelState, shape: Buckets) -> bool:
    """Whether every limited bucket is full: capacity is going unused (Lua: full)."""
    return (shape.r_burst is None or (state.r_level or 0.0) >= shape.r_burst) and (
        shape.t_burst is None or (state.t_level or 0.0) >= shape.t_burst
    )


def _take(state: ModelState, shape: Buckets, demand: Demand) -> Answer:
    """Charge one request and the demand's tokens (Lua: take)."""
    if state.r_level is not None:
        state.r_level -= 1
    tokens = demand.tokens if shape.t_burst is not None else 0
    if state.t_level is not None:
        state.t_level -= tokens
    return Answer(granted=True, tokens=tokens)


def prune_tickets(state: ModelState, now: float) -> None:
    """Forget the tenants with no batch call waiting (Lua: prune_tickets)."""
    for tenant in [t for t, clock in state.tickets.items() if clock <= now - TENANT_IDLE_SECONDS]:
        del state.tickets[tenant]
        state.weights.pop(tenant, None)
        state.served.pop(tenant, None)


def acquire(state: ModelState, demand: Demand, configured: Limits | None, now: float) -> Answer:
    """Grant the demand now, or say how long to wait (Lua: acquire)."""
    state.rpm, state.tpm = in_force(state, configured)
    shape = refill(state, now)
    if now < state.blocked_until:
        if demand.priority == "interactive":
            state.interactive_until = max(
                state.interactive_until, state.blocked_until + INTERACTIVE_GRACE_SECONDS
            )
        return Answer(granted=False, wait=state.blocked_until - now, reason="penalty")
    if state.rpm is None and state.tpm is None:
        return Answer(granted=True)
    if demand.priority == "interactive":
        return _interactive(state, shape, demand, now)
    return _batch(state, shape, demand, now)


def _interactive(state: ModelState, shape: Buckets, demand: Demand, now: float) -> Answer:
    """An interactive call: the whole bucket is its to take (Lua: interactive)."""
    r_wait, t_wait = _bucket_waits(state, shape, demand)
    if r_wait <= SLACK_SECONDS and t_wait <= SLACK_SECONDS:
        return _take(state, shape, demand)
    wait = max(r_wait, t_wait)
    state.interactive_until = max(state.interactive_until, now + wait + INTERACTIVE_GRACE_SECONDS)
    return Answer(granted=False, wait=wait, reason="requests" if r_wait >= t_wait else "tokens")


def _batch(state: ModelState, shape: Buckets, demand: Demand, now: float) -> Answer:
    """A batch call: above the interactive reserve, behind waiting interactive calls, in
    its tenant's turn, at its tenant's share when it must wait (Lua: batch)."""
    prune_tickets(state, now)
    r_wait, t_wait = _bucket_waits(state, shape, demand)
    aside = max(0.0, state.interactive_until - now)
    tenant = demand.tenant
    cost = max(
        1 / shape.r_rate if shape.r_rate is not None else 0.0,
        demand.tokens / shape.t_rate if shape.t_rate is not None else 0.0,
    )
    floor = _served_floor(state, tenant, now)
    served = state.served.get(tenant, floor if floor is not None else 0.0)
    full = _full(state, shape)
    in_turn = floor is None or served <= floor or full
    if r_wait <= SLACK_SECONDS and t_wait <= SLACK_SECONDS and aside <= 0 and in_turn:
        if full:
            state.tickets[tenant] = now
        if tenant in state.tickets:  # (only a waiting tenant's share is kept)
            state.served[tenant] = served + cost / demand.weight
            state.weights[tenant] = float(demand.weight)
        return _take(state, shape, demand)
    state.served[tenant] = served
    state.weights[tenant] = float(demand.weight)
    total = demand.weight
    for other, clock in state.tickets.items():
        if other != tenant and clock > now - TENANT_IDLE_SECONDS:
            total += state.weights.get(other, 1.0)
    spacing = cost / (demand.weight / total)
    after = max(r_wait, t_wait, aside, 0.0 if in_turn else spacing)
    ticket = max(state.tickets.get(tenant, -math.inf), now + after)
    state.tickets[tenant] = ticket + spacing
    return Answer(granted=False, wait=ticket - now, reason=_why(shape, r_wait, t_wait, aside))


def _served_floor(state: ModelState, tenant: str, now: float) -> float | None:
    """The least virtual service of the other tenants with batch calls waiting (None:
    none waits): a tenant ahead of it waits its turn (Lua: served_floor)."""
    others = [
        state.served.get(t, 0.0)
        for t, clock in state.tickets.items()
        if t != tenant and clock > now - TENANT_IDLE_SECONDS
    ]
    return min(others) if others else None


def _why(shape: Buckets, r_wait: float, t_wait: float, aside: float) -> Reason:
    """The reason a batch call waits: what it waits for longest (Lua: why).  A call
    out of its tenant's turn is named after the bucket that limits the spacing."""
    if aside > max(r_wait, t_wait):
        return "interactive"
    if r_wait > t_wait or (r_wait == t_wait and shape.r_rate is not None):
        return "requests"
    return "tokens"


def settle(state: ModelState, reserved: int, used: int, now: float) -> None:
    """A granted call reserved ``reserved`` tokens and used ``used`` (Lua: settle)."""
    if reserved == 0 or state.tpm is None or state.at is None:
        return  # nothing was reserved, or the state that held it was flushed
    shape = refill(state, now)
    if state.t_level is not None and shape.t_burst is not None:
        state.t_level = min(shape.t_burst, state.t_level + reserved - used)


def penalise(state: ModelState, retry_after: float, now: float) -> None:
    """A 429 came: slow the model down, block it for ``retry_after``, empty its buckets
    (Lua: penalise)."""
    refill(state, now)
    state.slow = max(MIN_SLOW, slowness(state, now) * SLOW_FACTOR)
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


def waiting_tenants(state: ModelState, now: float) -> dict[str, float]:
    """The tenants with batch calls waiting, and the seconds until their last ticket."""
    return {
        tenant: max(0.0, clock - now)
        for tenant, clock in state.tickets.items()
        if clock > now - TENANT_IDLE_SECONDS
    }


def grant_of(demand: Demand, answer: Answer, known: Limits | None) -> Grant:
    """The port's grant for ``answer``, with the limits learned as they stand."""
    return Grant(
        demand=demand,
        granted=answer.granted,
        wait=answer.wait,
        tokens=answer.tokens,
        reason=answer.reason,
        learned=known,
    )


def model_use(model: str, state: ModelState, now: float) -> ModelUse:
    """What an operator sees of the model at ``now``, without changing its state.  The
    limits shown are those in force at its latest acquire (configured ones included),
    else those learned."""
    view = copy.deepcopy(state)
    if view.rpm is None and view.tpm is None:
        view.rpm, view.tpm = in_force(view, None)
    refill(view, now)
    shown = None if view.rpm is None and view.tpm is None else Limits(rpm=view.rpm, tpm=view.tpm)
    return ModelUse(
        model=model,
        limits=shown,
        learned=learned(view),
        requests_available=view.r_level,
        tokens_available=view.t_level,
        slowed=slowness(view, now),
        blocked_seconds=max(0.0, view.blocked_until - now),
        waiting_tenants=waiting_tenants(view, now),
    )

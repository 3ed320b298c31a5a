"""The admission arithmetic, written once: pure functions over one model's
:class:`ModelState` and a time ``now`` in seconds.  :mod:`.local_admission` runs them
under a lock; ``lua/admission.lua`` mirrors them line by line (each function here names
its Lua twin), so the Redis and the in-process admissions give the same answers.  What
the provider says after a grant is folded in by :mod:`.admission_feedback`.

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

Every grant also counts what it took (``r_granted``, ``t_granted``, never refilled) and
hands the counts back as its marks: see "What the provider says" below.

Lanes.  An ``interactive`` call of a tenant in its turn (below) is granted when
``r_level >= 1`` and the token condition holds.  Denied, it is told the time until both
hold at the current rates, and batch calls step aside until that wait ends plus
INTERACTIVE_GRACE_SECONDS.  A ``batch`` call leaves a reserve for interactive ones: it
needs ``r_level >= 1 + R_RESERVE`` (``R_RESERVE = max(1, RESERVE_FRACTION * r_burst)``)
and ``t_level >= tokens + T_RESERVE`` (``T_RESERVE = RESERVE_FRACTION * t_burst``), each
capped at its bucket's burst (a bucket smaller than its reserve would otherwise never
admit a batch call: with ``rpm`` under 123 the request burst is below 2), and no
interactive call waiting.  An interactive call of a tenant out of its turn is weighed as
a batch call of that tenant: past its share, a tenant's interactive calls wait like
batch ones, so that no tenant takes the model from the others by calling all its work
interactive.

Tenants.  Two rules share the capacity among the tenants with calls waiting (a tenant
waits while its ticket clock is later than ``now - TENANT_IDLE_SECONDS``), in
proportion to their weights:

- whose turn it is: each waiting tenant has a virtual service, ``served += cost /
  weight`` per grant, where ``cost = max(1/r_rate, tokens/t_rate)`` is the capacity the
  call took in seconds of the rate (a limit not in force counts 0); a tenant whose
  service is ahead of the least served other waiting tenant is out of its turn and waits
  (its interactive calls as batch ones), unless every bucket is full (capacity would go
  unused).  A tenant that starts waiting starts at that least service: it banks no
  credit for the time it did not ask.  A tenant's interactive call granted while another
  tenant waits counts as waiting too (its clock is set to now): its service is what puts
  it out of its turn;
- when a denied call comes back: a ticket on its tenant's clock, ``share = weight / (sum
  of the weights of the tenants waiting, its own included)``, ``spacing = cost / share``,
  ``ticket = max(clock, now + wait)`` (``wait`` at least one spacing for a call out of
  its turn), ``clock = ticket + spacing``, and the call waits ``ticket - now``.  An
  interactive call's ticket is on its tenant's interactive clock instead, so that it
  comes back ahead of its tenant's own batch waiters (whose clock is then moved to its
  ticket if it was earlier).  A batch
  call granted while every bucket is full sets its tenant's clock to now: the tickets of
  waiters that gave up must not push later ones out.  An interactive call in its turn
  takes a ticket too (a tenant's hundred interactive waiters come back one at a time,
  not all at once, where a tenant's one call would lose to them every time), but batch
  calls step aside only until the capacity it waits for comes, not until its ticket.

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

What the provider says.  A provider's answer says what its buckets had left once they
counted the call (``observe``).  Ours are then held to that: ``level = min(level,
remaining - ahead)``, where ``ahead`` is what was granted after the call (its marks
against the counts now: still on their way to the provider, which has not counted
them).  Only ever lowered: a provider that says more than we hold may not have seen
calls we granted yet.  A provider rounds down (whole requests), so a hold may cost up to
one request, once: the provider is then that much ahead of us, and the next answer
finds nothing to lower.  So a bucket whose phase drifted from the provider's, or another
client of the same account, costs the capacity the provider does not have, instead of
429s.

429s.  ``penalise`` blocks every call of both lanes until ``now + retry_after`` (reason
``penalty``) and empties both buckets (``level = min(level, 0)``), which refill only from
the block's end: the provider said it is out, and when it will not be.  It slows the
model's rate only on evidence: ``slow = min(slow, 1 - (refusals - 1) / calls)`` (never
below MIN_SLOW), where ``refusals`` and ``calls`` count the 429s and the grants of the
last while, each fading by half every EVIDENCE_HALF_LIFE_SECONDS.  A lone 429 costs its
block and the buckets it emptied, nothing more (one among hundreds of calls is the phase
between two buckets, not a provider allowing less than it says); each 429 after it cuts
the rate by its share of the calls granted.  The rate recovers linearly: ``slow = min(1,
slow + (now - slowed_at) / RECOVERY_SECONDS)``.

The over-admission bound
------------------------
Over any window ``[a, b]`` of ``W = b - a`` seconds, with fixed limits:

- the requests granted are at most ``r_burst + rpm/60 * HEADROOM * W``: every grant takes
  one request from a level that is at least 1, the level never exceeds its burst, and it
  refills at no more than the unslowed rate (a penalty or a report only lowers it).
  (Plus the rate times SLACK_SECONDS, a microsecond: a millionth of a request at 60 a
  second);
- the tokens charged up to the window's last grant ``g`` (the reservations of the grants
  in ``[a, g]``, plus the excess of the settles in ``[a, g)`` over their reservations,
  minus the refunds they credited) are at most ``t_burst + tpm/60 * HEADROOM * W + max(0,
  tokens_g - t_burst)`` (plus the rate times SLACK_SECONDS): the same argument, where only
  a demand larger than the burst may leave the level below zero.

Both are checked, for any interleaving of acquires, settles, reports, penalties and time,
by tests/unit/test_admission_math.py.  A change of the limits in force resizes the
buckets (the bound holds with the largest).

A FLUSHALL (or a Redis that restarts empty) forgets every model's state: the next call
finds full buckets, so the bound above gains at most one burst of each bucket per flush
(and a debt, a penalty or the tenants' clocks are forgotten with it).  Limits learned
from a provider would be forgotten too; :class:`parley.coordination.redis_admission.RedisAdmission`
keeps a process-local copy of those it saw and restores them into a flushed state with
its next call.

Every time is in seconds on one clock: Redis's ``TIME`` for the fleet, the process's
monotonic clock in process.  A clock that steps back refills nothing (``last`` never
moves backwards).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from parley.ports.admission import Demand, Limits, Priority, Reason

HEADROOM = 0.98
"""The fraction of a provider's stated limit admitted: the provider's own bucket runs on
its clock, and a call reaches it after our network's jitter; without a margin, a fleet at
the limit meets 429s at every phase slip.  Small, because the provider's answers hold our
buckets to what it has left (``observe``): the margin covers the jitter between two
answers, not a drift that only 429s would reveal; and it caps what a backlog can use
of the limit (docs/performance.md#admission)."""
BURST_SECONDS = 1.0
"""Each bucket holds this many seconds of the unslowed rate (at least one request)."""
RESERVE_FRACTION = 0.1
"""The share of each burst a batch call leaves for interactive ones (at least one
request)."""
INTERACTIVE_GRACE_SECONDS = 0.25
"""How long past a denied interactive call's wait batch calls still step aside: time for
it to come back and take its capacity."""
TENANT_IDLE_SECONDS = 1.0
"""A tenant whose ticket clock is this far in the past has no call waiting."""
MIN_SLOW = 0.25
"""The least fraction of its rate a penalised model is admitted at."""
EVIDENCE_HALF_LIFE_SECONDS = 30.0
"""The 429s and grants a penalty weighs fade by half in this long."""
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
    r_granted: float = 0.0
    """Requests granted since the state began (a grant's mark)."""
    t_granted: float = 0.0
    """Tokens charged at grants since the state began."""
    calls: float = 0.0
    """Grants of the last while, fading (the evidence a penalty weighs)."""
    refusals: float = 0.0
    """429s of the last while, fading."""
    evidence_at: float = 0.0
    """When ``calls`` and ``refusals`` last faded."""
    tickets: dict[str, float] = field(default_factory=dict)
    """Each tenant's ticket clock (absolute time): its next batch waiter's turn, and how
    long it counts as waiting."""
    interactive_clocks: dict[str, float] = field(default_factory=dict)
    """Each tenant's interactive ticket clock: its interactive waiters' line, which goes
    ahead of its batch waiters'."""
    weights: dict[str, float] = field(default_factory=dict)
    served: dict[str, float] = field(default_factory=dict)
    """Each waiting tenant's virtual service: the capacity (in seconds of the rate) its
    calls were granted while it waited, divided by its weight."""


@dataclass(frozen=True)
class Answer:
    """What ``acquire`` decided: the fields of a :class:`~parley.ports.admission.Grant`."""

    granted: bool
    wait: float = 0.0
    tokens: int = 0
    reason: Reason = ""
    requests_mark: float = 0.0
    tokens_mark: float = 0.0


@dataclass(frozen=True)
class Buckets:
    """The limits in force as rates (per second, slowed) and bursts (None: not limited)."""

    r_rate: float | None
    r_burst: float | None
    t_rate: float | None
    t_burst: float | None


@dataclass(frozen=True)
class Turn:
    """Where a call's tenant stands among the tenants waiting."""

    cost: float
    """The capacity the call takes, in seconds of the rate."""
    floor: float | None
    """The least service of the other waiting tenants (None: none waits)."""
    served: float
    """The tenant's service (a tenant that starts waiting starts at the floor)."""
    full: bool
    """Every bucket is full: capacity would go unused."""

    @property
    def in_turn(self) -> bool:
        return self.floor is None or self.served <= self.floor or self.full


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


def faded(state: ModelState, now: float) -> None:
    """Fade the counts of recent grants and 429s to ``now`` (Lua: faded)."""
    if now > state.evidence_at:
        fade = 0.5 ** ((now - state.evidence_at) / EVIDENCE_HALF_LIFE_SECONDS)
        state.calls *= fade
        state.refusals *= fade
        state.evidence_at = now


def _needs(shape: Buckets, tokens: int, lane: Priority) -> tuple[float, float]:
    """The request and token levels a call of ``tokens`` needs in ``lane`` (Lua: needs)."""
    r_need, t_need = 1.0, float(tokens)
    if lane == "batch":
        r_need += max(1.0, RESERVE_FRACTION * shape.r_burst) if shape.r_burst is not None else 0
        t_need += RESERVE_FRACTION * shape.t_burst if shape.t_burst is not None else 0
    return (
        min(r_need, shape.r_burst) if shape.r_burst is not None else 0.0,
        min(t_need, shape.t_burst) if shape.t_burst is not None else 0.0,
    )


def _bucket_waits(
    state: ModelState, shape: Buckets, tokens: int, lane: Priority
) -> tuple[float, float]:
    """Seconds until the request and the token level reach what a call needs in
    ``lane``, at the current rates (0: already there) (Lua: bucket_waits)."""
    r_need, t_need = _needs(shape, tokens, lane)
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


def _take(state: ModelState, shape: Buckets, demand: Demand, now: float) -> Answer:
    """Charge one request and the demand's tokens, and count them (Lua: take)."""
    if state.r_level is not None:
        state.r_level -= 1
    tokens = demand.tokens if shape.t_burst is not None else 0
    if state.t_level is not None:
        state.t_level -= tokens
    state.r_granted += 1
    state.t_granted += tokens
    faded(state, now)
    state.calls += 1
    return Answer(
        granted=True, tokens=tokens, requests_mark=state.r_granted, tokens_mark=state.t_granted
    )


def prune_tickets(state: ModelState, now: float) -> None:
    """Forget the tenants with no call waiting (Lua: prune_tickets)."""
    for tenant in [t for t, clock in state.tickets.items() if clock <= now - TENANT_IDLE_SECONDS]:
        del state.tickets[tenant]
        state.weights.pop(tenant, None)
        state.served.pop(tenant, None)
        state.interactive_clocks.pop(tenant, None)


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
    prune_tickets(state, now)
    turn = _turn(state, shape, demand, now)
    if demand.priority == "interactive" and turn.in_turn:
        return _interactive(state, shape, demand, now, turn)
    return _batch(state, shape, demand, now, turn)


def _turn(state: ModelState, shape: Buckets, demand: Demand, now: float) -> Turn:
    """Where the demand's tenant stands (Lua: turn)."""
    cost = max(
        1 / shape.r_rate if shape.r_rate is not None else 0.0,
        demand.tokens / shape.t_rate if shape.t_rate is not None else 0.0,
    )
    floor = _served_floor(state, demand.tenant, now)
    served = state.served.get(demand.tenant, floor if floor is not None else 0.0)
    return Turn(cost=cost, floor=floor, served=served, full=_full(state, shape))


def _interactive(
    state: ModelState, shape: Buckets, demand: Demand, now: float, turn: Turn
) -> Answer:
    """An interactive call in its tenant's turn: the whole bucket is its to take, and
    batch calls step aside while it waits (Lua: interactive)."""
    r_wait, t_wait = _bucket_waits(state, shape, demand.tokens, "interactive")
    if r_wait <= SLACK_SECONDS and t_wait <= SLACK_SECONDS:
        if turn.floor is not None:
            # Another tenant waits: this one's service counts, and it counts as waiting.
            tenant = demand.tenant
            state.tickets[tenant] = max(state.tickets.get(tenant, -math.inf), now)
            state.served[tenant] = turn.served + turn.cost / demand.weight
            state.weights[tenant] = float(demand.weight)
        return _take(state, shape, demand, now)
    wait = max(r_wait, t_wait)
    # Aside for as long as the capacity this call waits for takes to come, not its
    # ticket: a tenant's hundred interactive waiters must not hold every batch call back.
    state.interactive_until = max(state.interactive_until, now + wait + INTERACTIVE_GRACE_SECONDS)
    return _ticket(state, demand, now, turn, wait, "requests" if r_wait >= t_wait else "tokens")


def _batch(state: ModelState, shape: Buckets, demand: Demand, now: float, turn: Turn) -> Answer:
    """A batch call, or an interactive one out of its tenant's turn: above the
    interactive reserve, behind waiting interactive calls, in its tenant's turn, at its
    tenant's share when it must wait (Lua: batch)."""
    r_wait, t_wait = _bucket_waits(state, shape, demand.tokens, "batch")
    aside = max(0.0, state.interactive_until - now)
    tenant = demand.tenant
    if r_wait <= SLACK_SECONDS and t_wait <= SLACK_SECONDS and aside <= 0 and turn.in_turn:
        if turn.full:
            state.tickets[tenant] = now
        if tenant in state.tickets:  # (only a waiting tenant's share is kept)
            state.served[tenant] = turn.served + turn.cost / demand.weight
            state.weights[tenant] = float(demand.weight)
        return _take(state, shape, demand, now)
    after = max(r_wait, t_wait, aside)
    return _ticket(state, demand, now, turn, after, _why(shape, r_wait, t_wait, aside))


def _ticket(
    state: ModelState, demand: Demand, now: float, turn: Turn, after: float, reason: Reason
) -> Answer:
    """A denied call's ticket, at least ``after`` from now (one spacing, for a call out of
    its turn), its tenant waiting from now (Lua: ticket).  On its tenant's clock; an
    interactive call's on its tenant's interactive clock, ahead of the tenant's batch
    waiters (their clock then starts no earlier than its ticket)."""
    tenant = demand.tenant
    state.served[tenant] = turn.served
    state.weights[tenant] = float(demand.weight)
    total = demand.weight
    for other, clock in state.tickets.items():
        if other != tenant and clock > now - TENANT_IDLE_SECONDS:
            total += state.weights.get(other, 1.0)
    spacing = turn.cost / (demand.weight / total)
    after = max(after, 0.0 if turn.in_turn else spacing)
    if demand.priority == "interactive":
        ticket = max(state.interactive_clocks.get(tenant, -math.inf), now + after)
        state.interactive_clocks[tenant] = ticket + spacing
        state.tickets[tenant] = max(state.tickets.get(tenant, -math.inf), ticket)
    else:
        ticket = max(state.tickets.get(tenant, -math.inf), now + after)
        state.tickets[tenant] = ticket + spacing
    return Answer(granted=False, wait=ticket - now, reason=reason)


def _served_floor(state: ModelState, tenant: str, now: float) -> float | None:
    """The least virtual service of the other tenants with calls waiting (None: none
    waits): a tenant ahead of it waits its turn (Lua: served_floor)."""
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

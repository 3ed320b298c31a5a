"""The admission arithmetic (workers/coordination/admission_math.py) through the in-process
admission on a fake clock: no interleaving of acquires (both lanes, several tenants, any
token sizes), settles (refunds and debts), 429 penalties and time admits more than the
stated bound over any window; interactive calls go before batch ones; a late tenant is
not stuck behind another's backlog; two tenants 3:1 are granted 3:1; a penalty blocks and
then recovers; with no limit known every call goes at once.  The Redis twin gives the
same answers (tests/integration/test_admission_contract.py)."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.errors import InvalidRequest
from workers.coordination import admission_math as am
from workers.coordination.local_admission import LocalAdmission
from workers.ports.admission import PRIORITIES, Demand, Grant, Limits, Priority

MODEL = "openai:gpt-4o-mini"


@dataclass
class FakeClock:
    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now


def admission() -> tuple[LocalAdmission, FakeClock]:
    clock = FakeClock()
    return LocalAdmission(clock=clock), clock


def demand(
    tokens: int = 0, priority: Priority = "interactive", tenant: str = "", weight: float = 1.0
) -> Demand:
    return Demand(model=MODEL, tokens=tokens, priority=priority, tenant=tenant, weight=weight)


# ------------------------------------------------------------------ the over-admission bound


@dataclass
class Ledger:
    """What a run granted and settled, in the order it happened."""

    # ("grant", time, reserved) or ("settle", time, used - reserved)
    entries: list[tuple[str, float, int]] = field(default_factory=list)


OPERATION = st.one_of(
    st.tuples(
        st.just("acquire"),
        st.sampled_from(["interactive", "batch"]),
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 3_000),
    ),
    st.tuples(st.just("settle"), st.integers(0, 50), st.integers(0, 4_000)),
    st.tuples(st.just("penalise"), st.floats(0, 3)),
    st.tuples(st.just("advance"), st.floats(0, 2)),
)


def _run(limits: Limits, operations: list[tuple[object, ...]]) -> Ledger:
    adm, clock = admission()
    ledger = Ledger()
    outstanding: list[Grant] = []
    weights = {"a": 3.0, "b": 1.0, "c": 0.5}
    for op in operations:
        if op[0] == "acquire":
            _, priority, tenant, tokens = op
            assert isinstance(tenant, str) and isinstance(tokens, int)
            grant = adm.acquire(
                demand(tokens, priority, tenant, weights[tenant]),  # type: ignore[arg-type]
                limits,
            )
            if grant.granted:
                ledger.entries.append(("grant", clock.now, grant.tokens))
                outstanding.append(grant)
            else:
                assert grant.wait > 0 and grant.reason in (
                    "requests",
                    "tokens",
                    "interactive",
                    "penalty",
                )
        elif op[0] == "settle" and outstanding:
            index, used = op[1], op[2]
            assert isinstance(index, int) and isinstance(used, int)
            grant = outstanding.pop(index % len(outstanding))
            adm.settle(grant, used)
            if grant.tokens:
                ledger.entries.append(("settle", clock.now, used - grant.tokens))
        elif op[0] == "penalise":
            assert isinstance(op[1], float)
            adm.penalise(MODEL, op[1])
        elif op[0] == "advance":
            assert isinstance(op[1], float)
            clock.now += op[1]
    return ledger


def _check_bound(limits: Limits, ledger: Ledger) -> None:
    """For every window from one grant to a later one: requests and the tokens charged
    within it (reservations, plus settles' excess minus their refunds) stay within the
    bound admission_math's docstring states."""
    shape = am.buckets(limits.rpm, limits.tpm, 1.0)
    entries = ledger.entries
    grants = [i for i, entry in enumerate(entries) if entry[0] == "grant"]
    for first_index, first in enumerate(grants):
        requests, charged = 0, 0
        for i in range(first, len(entries)):
            kind, at, amount = entries[i]
            charged += amount
            if kind != "grant":
                continue
            requests += 1
            window = at - entries[first][1]
            if shape.r_rate is not None and shape.r_burst is not None:
                bound = shape.r_burst + shape.r_rate * (window + am.SLACK_SECONDS)
                assert requests <= bound + 1e-6, (first_index, requests, bound)
            if shape.t_rate is not None and shape.t_burst is not None:
                overshoot = max(0.0, amount - shape.t_burst)
                bound = shape.t_burst + shape.t_rate * (window + am.SLACK_SECONDS) + overshoot
                assert charged <= bound * (1 + 1e-9) + 1e-6, (first_index, charged, bound)


@settings(max_examples=300, deadline=None)
@given(
    rpm=st.sampled_from([None, 30, 100, 600, 6_000]),
    tpm=st.sampled_from([None, 2_000, 60_000, 600_000]),
    operations=st.lists(OPERATION, max_size=120),
)
def test_no_interleaving_admits_more_than_the_bound_over_any_window(
    rpm: int | None, tpm: int | None, operations: list[tuple[object, ...]]
) -> None:
    if rpm is None and tpm is None:
        rpm = 600
    limits = Limits(rpm=rpm, tpm=tpm)
    _check_bound(limits, _run(limits, operations))


def test_the_bound_check_fails_for_a_bucket_that_over_admits() -> None:
    """The check above is not vacuous: a ledger of a bucket twice as fast breaks it."""
    limits = Limits(rpm=600, tpm=60_000)
    too_many = Ledger([("grant", 1_000.0 + i * 0.05, 0) for i in range(40)])
    with pytest.raises(AssertionError):
        _check_bound(limits, too_many)
    too_much = Ledger([("grant", 1_000.0 + i * 0.05, 300) for i in range(40)])
    with pytest.raises(AssertionError):
        _check_bound(Limits(tpm=60_000), too_much)


def test_a_full_bucket_lets_a_burst_through_then_the_rate() -> None:
    adm, clock = admission()
    limits = Limits(rpm=600)  # 9.5 requests a second admitted, a burst of 9.5
    granted = sum(adm.acquire(demand(), limits).granted for _ in range(20))
    assert granted == 9
    clock.now += 0.5
    assert sum(adm.acquire(demand(), limits).granted for _ in range(20)) == 5  # 0.5 + 4.75
    clock.now += 60.0
    assert sum(adm.acquire(demand(), limits).granted for _ in range(20)) == 9  # never past full


# ------------------------------------------------------------------ tokens: reserve, settle


def test_a_refund_gives_tokens_back_and_a_debt_is_waited_out() -> None:
    adm, clock = admission()
    limits = Limits(tpm=60_000)  # 950 tokens a second, a burst of 950
    first = adm.acquire(demand(900), limits)
    assert first.granted and first.tokens == 900
    assert not adm.acquire(demand(900), limits).granted
    adm.settle(first, 50)  # it used less: 850 back, the level at 900
    second = adm.acquire(demand(900), limits)
    assert second.granted
    adm.settle(second, 2_800)  # it used more: a debt of 1,900
    wait = adm.acquire(demand(100), limits)
    assert not wait.granted and wait.reason == "tokens"
    assert wait.wait == pytest.approx((100 + 1_900) / 950)
    clock.now += wait.wait
    assert adm.acquire(demand(100), limits).granted


def test_a_demand_larger_than_the_bucket_goes_through_a_full_one_and_leaves_a_debt() -> None:
    adm, clock = admission()
    limits = Limits(tpm=60_000)
    assert adm.acquire(demand(5_000), limits).granted
    refused = adm.acquire(demand(1), limits)
    assert not refused.granted
    assert refused.wait == pytest.approx((1 + 5_000 - 950) / 950)
    clock.now += 2.0  # not yet full again
    assert not adm.acquire(demand(5_000), limits).granted


def test_a_grant_without_a_token_limit_reserves_nothing_and_settles_to_nothing() -> None:
    adm, _ = admission()
    grant = adm.acquire(demand(10_000), Limits(rpm=600))
    assert grant.granted and grant.tokens == 0
    adm.settle(grant, 50_000)
    assert adm.use([MODEL])[0].tokens_available is None


# ------------------------------------------------------------------ lanes


@settings(max_examples=200, deadline=None)
@given(
    rpm=st.integers(127, 20_000),
    tpm=st.sampled_from([None, 60_000, 1_000_000]),
    taken=st.integers(0, 400),
    tokens_fraction=st.floats(0, 0.9),
    interactive_first=st.booleans(),
)
def test_interactive_is_granted_before_batch_when_both_ask_at_once(
    rpm: int, tpm: int | None, taken: int, tokens_fraction: float, interactive_first: bool
) -> None:
    """Whatever capacity is left, at the same instant a batch call is never granted while
    an interactive one (of no more tokens than the reserve) is refused.  (A request burst
    under 2, rpm below 127, cannot hold a batch call's reserve: there batch calls wait
    for a full bucket instead.)"""
    adm, _ = admission()
    limits = Limits(rpm=rpm, tpm=tpm)
    shape = am.buckets(rpm, tpm, 1.0)
    tokens = int(tokens_fraction * shape.t_burst) if shape.t_burst is not None else 10
    # What a batch call leaves: a request, and RESERVE_FRACTION of the token burst.
    small = int(am.RESERVE_FRACTION * shape.t_burst) if shape.t_burst is not None else 10
    for _ in range(taken):
        if not adm.acquire(demand(tokens), limits).granted:
            break
    asks = {"interactive": demand(small), "batch": demand(tokens, "batch")}
    order = ["interactive", "batch"] if interactive_first else ["batch", "interactive"]
    answers = {lane: adm.acquire(asks[lane], limits) for lane in order}
    assert answers["interactive"].granted or not answers["batch"].granted


def test_batch_steps_aside_while_an_interactive_call_waits() -> None:
    adm, clock = admission()
    limits = Limits(rpm=600)
    while adm.acquire(demand(), limits).granted:
        pass
    told = adm.acquire(demand(), limits)  # the interactive call waits...
    clock.now += told.wait
    batch = adm.acquire(demand(0, "batch"), limits)  # ...and a batch call gives it room
    assert not batch.granted and batch.reason == "interactive"
    assert batch.wait >= am.INTERACTIVE_GRACE_SECONDS - 1e-9
    assert adm.acquire(demand(), limits).granted


# ------------------------------------------------------------------ tenants


def test_a_late_tenant_waits_its_share_not_behind_the_first_tenants_backlog() -> None:
    adm, clock = admission()
    limits = Limits(rpm=600)
    backlog = [adm.acquire(demand(0, "batch", "big"), limits) for _ in range(200)]
    waits = [g.wait for g in backlog if not g.granted]
    assert max(waits) > 15  # 200 calls at 9.5 a second
    clock.now += 0.5
    for _ in range(5):
        adm.acquire(demand(0, "batch", "big"), limits)  # its first waiters, back
    late = [adm.acquire(demand(0, "batch", "late"), limits) for _ in range(10)]
    assert not late[0].granted and late[0].wait < 0.5
    # Its ten are spread at half the rate (two tenants of weight 1 both wait).
    assert max(g.wait for g in late) < 10 * 2 / 9.5 + 0.5


def test_a_late_tenants_ten_calls_are_granted_at_its_share_while_a_backlog_waits() -> None:
    """Simulated: a tenant's 1,000 waiters come back at their waits and ask again; five
    seconds in, another tenant asks ten times.  Its ten are granted within about the
    time ten calls take at half the rate, not after the backlog."""
    done = _simulate({"big": 1.0, "late": 1.0}, seconds=30, backlog={"late": 10}, late=5.0)
    assert done["late"][-1] - 5.0 < 10 / (1_140 / 60 / 2) + 0.5
    assert len(done["late"]) == 10 and len(done["big"]) > 400


def test_stale_tickets_of_waiters_that_gave_up_do_not_push_later_ones_out() -> None:
    adm, clock = admission()
    limits = Limits(rpm=600)
    for _ in range(200):
        adm.acquire(demand(0, "batch", "t"), limits)  # told to wait; none come back
    clock.now += 1.5  # the bucket is full again
    assert adm.acquire(demand(0, "batch", "t"), limits).granted  # its clock starts at now
    while adm.acquire(demand(0, "batch", "t"), limits).granted:
        pass
    assert adm.acquire(demand(0, "batch", "t"), limits).wait < 1.0


def _simulate(
    weights: dict[str, float],
    seconds: float,
    backlog: dict[str, int] | None = None,
    late: float = 0.0,
) -> dict[str, list[float]]:
    """Each tenant has a backlog of batch calls (1,000 unless ``backlog`` says), asked
    at once (the last tenant ``late`` seconds after the others); a refused call comes
    back at its wait and asks again.  Returns when each tenant's calls were granted, in
    seconds from the start."""
    adm, clock = admission()
    limits = Limits(rpm=1_200, tpm=600_000)
    queue: list[tuple[float, int, str]] = []
    start = clock.now
    for number, tenant in enumerate(weights):
        at = start + (late if number == len(weights) - 1 else 0.0)
        for _ in range((backlog or {}).get(tenant, 1_000)):
            heapq.heappush(queue, (at, len(queue), tenant))
    seq = len(queue)
    granted: dict[str, list[float]] = {tenant: [] for tenant in weights}
    while queue and queue[0][0] < start + seconds:
        at, _, tenant = heapq.heappop(queue)
        clock.now = at
        grant = adm.acquire(demand(500, "batch", tenant, weights[tenant]), limits)
        if grant.granted:
            adm.settle(grant, 400)
            granted[tenant].append(at - start)
        else:
            heapq.heappush(queue, (at + grant.wait, seq, tenant))
            seq += 1
    return granted


def _counts(granted: dict[str, list[float]], since: float) -> dict[str, int]:
    return {tenant: sum(at >= since for at in times) for tenant, times in granted.items()}


@pytest.mark.parametrize("late", [0.0, 5.0])
def test_two_tenants_3_to_1_that_both_wait_are_granted_3_to_1(late: float) -> None:
    """Whether they asked together or the light one came when the heavy one's backlog had
    been given its tickets alone."""
    granted = _counts(_simulate({"heavy": 3.0, "light": 1.0}, seconds=60, late=late), late + 2)
    assert granted["light"] > 100
    assert granted["heavy"] / granted["light"] == pytest.approx(3.0, rel=0.10)
    total = granted["heavy"] + granted["light"]
    rate = 1_200 / 60 * am.HEADROOM
    assert total == pytest.approx((58 - late) * rate, rel=0.05)  # the whole rate, used


def test_equal_tenants_are_granted_alike() -> None:
    granted = _counts(_simulate({"a": 1.0, "b": 1.0, "c": 1.0}, seconds=40, late=3.0), 5)
    low, high = min(granted.values()), max(granted.values())
    assert high / low < 1.1


# ------------------------------------------------------------------ 429s


def test_a_penalty_blocks_both_lanes_then_the_rate_recovers() -> None:
    adm, clock = admission()
    limits = Limits(rpm=600)
    adm.penalise(MODEL, 5.0)
    for priority in PRIORITIES:
        blocked = adm.acquire(demand(0, priority), limits)
        assert not blocked.granted and blocked.reason == "penalty"
        assert blocked.wait == pytest.approx(5.0)
    assert adm.use([MODEL])[0].slowed == pytest.approx(0.5)
    assert adm.use([MODEL])[0].blocked_seconds == pytest.approx(5.0)
    clock.now += 4.9
    assert not adm.acquire(demand(), limits).granted  # nothing refilled while blocked
    clock.now += 0.1
    # From an empty bucket, at half the rate climbing back by 1/30 of it a second: over
    # these five seconds, from 2/3 to 5/6 of 9.5 a second.
    granted = 0
    for _ in range(100):
        clock.now += 0.05
        granted += adm.acquire(demand(), limits).granted
    assert granted == pytest.approx(9.5 * 5 * 0.75, abs=2)
    clock.now += am.RECOVERY_SECONDS
    assert adm.use([MODEL])[0].slowed == 1.0
    assert adm.use([MODEL])[0].blocked_seconds == 0.0


def test_penalties_halve_the_rate_down_to_a_floor() -> None:
    adm, _ = admission()
    for _ in range(5):
        adm.penalise(MODEL, 0.0)
    assert adm.use([MODEL])[0].slowed == am.MIN_SLOW


# ------------------------------------------------------------------ limits known, or not


@settings(max_examples=100, deadline=None)
@given(
    tokens=st.integers(0, 10**9),
    priority=st.sampled_from(["interactive", "batch"]),
    calls=st.integers(1, 50),
)
def test_with_no_limit_known_every_call_is_granted_at_once(
    tokens: int, priority: Priority, calls: int
) -> None:
    adm, _ = admission()
    for _ in range(calls):
        grant = adm.acquire(demand(tokens, priority, "t"), None)
        assert grant.granted and grant.wait == 0 and grant.tokens == 0 and grant.learned is None


def test_learned_limits_are_in_force_field_by_field_under_configured_ones() -> None:
    adm, clock = admission()
    adm.learn(MODEL, Limits(rpm=60, tpm=1_000_000))
    adm.learn(MODEL, Limits(tpm=60_000))  # a None leaves the rpm as it was
    grant = adm.acquire(demand(10), None)
    assert grant.learned == Limits(rpm=60, tpm=60_000)
    assert not adm.acquire(demand(10), None).granted  # a burst of one request
    use = adm.use([MODEL])[0]
    assert use.limits == Limits(rpm=60, tpm=60_000)
    # Configured rpm, learned tpm.
    clock.now += 0.1
    assert adm.acquire(demand(10), Limits(rpm=6_000)).granted
    assert adm.use([MODEL])[0].limits == Limits(rpm=6_000, tpm=60_000)


def test_use_reports_levels_and_waiting_tenants_without_changing_anything() -> None:
    adm, clock = admission()
    limits = Limits(rpm=600, tpm=60_000)
    adm.acquire(demand(100), limits)
    for _ in range(20):
        adm.acquire(demand(100, "batch", "acme", 2.0), limits)
    use = adm.use([MODEL, "other"])
    # One interactive call, then batch calls while they leave 1 + 1.9 requests.
    assert use[0].requests_available == pytest.approx(9.5 - 8)
    assert use[0].tokens_available == pytest.approx(950 - 800)
    assert set(use[0].waiting_tenants) == {"acme"} and use[0].waiting_tenants["acme"] > 1
    assert use[1].limits is None and use[1].waiting_tenants == {}
    assert adm.use([MODEL]) == adm.use([MODEL])
    clock.now += 0.5
    assert adm.use([MODEL])[0].requests_available == pytest.approx(1.5 + 4.75)


def test_an_unused_model_is_forgotten_after_its_state_expires() -> None:
    adm, clock = admission()
    adm.learn(MODEL, Limits(rpm=60))
    clock.now += 3_601
    assert adm.use([MODEL])[0].learned is None


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "bad",
    [
        {"tokens": -1},
        {"tokens": 1.5},
        {"tokens": True},
        {"priority": "urgent"},
        {"weight": 0},
        {"weight": math.inf},
        {"weight": math.nan},
        {"model": ""},
    ],
)
def test_a_malformed_demand_is_refused_with_what_is_wrong(bad: dict[str, object]) -> None:
    adm, _ = admission()
    fields: dict[str, object] = {"model": MODEL, "tokens": 1, **bad}
    with pytest.raises(InvalidRequest, match=next(iter(bad))):
        adm.acquire(Demand(**fields), None)  # type: ignore[arg-type]


def test_bad_penalties_and_settles_are_refused() -> None:
    adm, _ = admission()
    with pytest.raises(InvalidRequest, match="retry_after"):
        adm.penalise(MODEL, -1)
    with pytest.raises(InvalidRequest, match="retry_after"):
        adm.penalise(MODEL, math.nan)
    with pytest.raises(InvalidRequest, match="model"):
        adm.learn("", Limits(rpm=1))
    grant = adm.acquire(demand(10), Limits(tpm=60_000))
    with pytest.raises(InvalidRequest, match="used_tokens"):
        adm.settle(grant, -5)


def test_tenants_that_never_wait_leave_nothing_behind() -> None:
    """Only waiting tenants are kept (a tenant granted at a full bucket waits for a
    second): a model's state does not grow with every tenant that ever called it."""
    state, now = am.ModelState(), 1_000.0
    limits = Limits(rpm=60_000)
    for number in range(100):
        assert am.acquire(state, demand(0, "batch", f"t{number}"), limits, now).granted
    assert set(state.tickets) == set(state.weights) == set(state.served) == {"t0"}
    am.acquire(state, demand(0, "batch", "late"), limits, now + am.TENANT_IDLE_SECONDS + 0.1)
    assert state.tickets == {"late": now + am.TENANT_IDLE_SECONDS + 0.1}  # full again
    assert set(state.weights) == set(state.served) == {"late"}

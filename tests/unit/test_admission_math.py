"""The admission arithmetic (src/parley/coordination/admission_math.py) through the in-process
admission on a fake clock: no interleaving of acquires (both lanes, several tenants, any
token sizes), settles (refunds and debts), providers' reports, 429 penalties and time
admits more than the stated bound over any window; interactive calls go before batch
ones; a late tenant is not stuck behind another's backlog; two tenants 3:1 are granted
3:1; a lone 429 costs its block, repeated ones slow the rate by their share; what a
provider says it has left holds the buckets to it; with no limit known every call goes
at once.  The Redis twin gives the
same answers (tests/integration/test_admission_contract.py)."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.coordination import admission_math as am
from parley.coordination.local_admission import LocalAdmission
from parley.ports.admission import PRIORITIES, Demand, Grant, Limits, Priority, ProviderReport
from parley.schemas.errors import InvalidRequest

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
    st.tuples(
        st.just("observe"),
        st.integers(0, 50),
        st.one_of(st.none(), st.integers(0, 200)),
        st.one_of(st.none(), st.integers(0, 20_000)),
    ),
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
        elif op[0] == "observe" and outstanding:
            index, requests, tokens = op[1], op[2], op[3]
            assert isinstance(index, int)
            report = ProviderReport(requests_remaining=requests, tokens_remaining=tokens)  # type: ignore[arg-type]
            adm.observe(outstanding[index % len(outstanding)], report)
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
    limits = Limits(rpm=600)  # 9.8 requests a second admitted, a burst of 9.8
    granted = sum(adm.acquire(demand(), limits).granted for _ in range(20))
    assert granted == 9
    clock.now += 0.5
    assert sum(adm.acquire(demand(), limits).granted for _ in range(20)) == 5  # 0.8 + 4.9
    clock.now += 60.0
    assert sum(adm.acquire(demand(), limits).granted for _ in range(20)) == 9  # never past full


# ------------------------------------------------------------------ tokens: reserve, settle


def test_a_refund_gives_tokens_back_and_a_debt_is_waited_out() -> None:
    adm, clock = admission()
    limits = Limits(tpm=60_000)  # 980 tokens a second, a burst of 980
    first = adm.acquire(demand(900), limits)
    assert first.granted and first.tokens == 900
    assert not adm.acquire(demand(900), limits).granted
    adm.settle(first, 50)  # it used less: 850 back, the level at 930
    second = adm.acquire(demand(900), limits)
    assert second.granted
    adm.settle(second, 2_800)  # it used more: 1,900, the level at 30 - 1,900
    wait = adm.acquire(demand(100), limits)
    assert not wait.granted and wait.reason == "tokens"
    assert wait.wait == pytest.approx((100 + 1_870) / 980)
    clock.now += wait.wait
    assert adm.acquire(demand(100), limits).granted


def test_a_demand_larger_than_the_bucket_goes_through_a_full_one_and_leaves_a_debt() -> None:
    adm, clock = admission()
    limits = Limits(tpm=60_000)
    assert adm.acquire(demand(5_000), limits).granted
    refused = adm.acquire(demand(1), limits)
    assert not refused.granted
    assert refused.wait == pytest.approx((1 + 5_000 - 980) / 980)
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
    rpm=st.integers(123, 20_000),
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
    under 2, rpm below 123, cannot hold a batch call's reserve: there batch calls wait
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
    assert adm.acquire(demand(), limits).granted


# ------------------------------------------------------------------ tenants


def test_a_late_tenant_waits_its_share_not_behind_the_first_tenants_backlog() -> None:
    adm, clock = admission()
    limits = Limits(rpm=600)
    backlog = [adm.acquire(demand(0, "batch", "big"), limits) for _ in range(200)]
    waits = [g.wait for g in backlog if not g.granted]
    assert max(waits) > 15  # 200 calls at 9.8 a second
    clock.now += 0.5
    for _ in range(5):
        adm.acquire(demand(0, "batch", "big"), limits)  # its first waiters, back
    late = [adm.acquire(demand(0, "batch", "late"), limits) for _ in range(10)]
    assert not late[0].granted and late[0].wait < 0.5
    # Its ten are spread at half the rate (two tenants of weight 1 both wait).
    assert max(g.wait for g in late) < 10 * 2 / 9.8 + 0.5


def test_a_late_tenants_ten_calls_are_granted_at_its_share_while_a_backlog_waits() -> None:
    """Simulated: a tenant's 1,000 waiters come back at their waits and ask again; five
    seconds in, another tenant asks ten times.  Its ten are granted within about the
    time ten calls take at half the rate, not after the backlog."""
    done = _simulate({"big": 1.0, "late": 1.0}, seconds=30, backlog={"late": 10}, late=5.0)
    assert done["late"][-1] - 5.0 < 10 / (1_176 / 60 / 2) + 0.5
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
    lanes: dict[str, Priority] | None = None,
) -> dict[str, list[float]]:
    """Each tenant has a backlog of calls (1,000 unless ``backlog`` says; batch calls
    unless ``lanes`` says), asked at once (the last tenant ``late`` seconds after the
    others); a refused call comes back at its wait and asks again.  Returns when each
    tenant's calls were granted, in seconds from the start."""
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
        lane = (lanes or {}).get(tenant, "batch")
        grant = adm.acquire(demand(500, lane, tenant, weights[tenant]), limits)
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


@pytest.mark.parametrize(("flooding", "waiting"), [(1.0, 1.0), (1.0, 3.0), (3.0, 1.0)])
def test_a_tenant_that_calls_all_its_work_interactive_gets_its_share_not_the_model(
    flooding: float, waiting: float
) -> None:
    """Issue 43: one tenant's interactive backlog pushed another's batch back for as long
    as it lasted (batch calls step aside while an interactive one waits).  Past its share
    a tenant's interactive calls wait like batch ones: the two are granted by weight."""
    granted = _simulate(
        {"flood": flooding, "other": waiting}, seconds=40, lanes={"flood": "interactive"}
    )
    counts = _counts(granted, 2.0)
    assert counts["other"] > 100
    assert counts["flood"] / counts["other"] == pytest.approx(flooding / waiting, rel=0.15)


def test_another_tenants_interactive_call_goes_first_past_a_tenants_interactive_backlog() -> None:
    """Issue 43: another tenant's interactive first token went from 0.05 s to 17.2 s
    behind a tenant's forty interactive turns: its call came back with the backlog's
    waiters, all told the same wait, and lost to them every time (here, for the 25 s the
    simulation lasts).  Its call is in its turn at once, the waiters spaced by tickets."""
    granted = _simulate(
        {"flood": 1.0, "person": 1.0},
        seconds=30,
        backlog={"person": 1},
        late=5.05,
        lanes={"flood": "interactive", "person": "interactive"},
    )
    assert granted["person"] and granted["person"][0] - 5.05 < 0.5, granted["person"]
    assert len(granted["flood"]) > 400


def test_a_tenants_interactive_call_comes_back_ahead_of_its_own_batch_waiters() -> None:
    """Issue 43's other tenant had a batch waiting too.  Its interactive call, out of its
    turn (its batch was granted last), must wait for its tenant's next turn, not behind
    the tickets of its tenant's own batch waiters (four seconds of them here)."""
    now, limits = 1_000.0, Limits(rpm=600)
    state = am.ModelState(
        r_level=0.0,
        at=now,
        tickets={"flood": now + 0.5, "other": now + 4.0},
        weights={"flood": 1.0, "other": 1.0},
        served={"flood": 1.0, "other": 2.0},
    )
    answer = am.acquire(state, demand(0, "interactive", "other"), limits, now)
    spacing = 1 / (600 / 60 * am.HEADROOM) / 0.5  # a request's time, at half the rate
    assert not answer.granted and answer.wait == pytest.approx(spacing)
    assert state.tickets["other"] == now + 4.0  # its batch waiters keep their tickets
    batch = am.acquire(state, demand(0, "batch", "other"), limits, now)
    assert batch.wait == pytest.approx(4.0)  # and come after


def test_equal_tenants_are_granted_alike() -> None:
    granted = _counts(_simulate({"a": 1.0, "b": 1.0, "c": 1.0}, seconds=40, late=3.0), 5)
    low, high = min(granted.values()), max(granted.values())
    assert high / low < 1.1


# ------------------------------------------------------------------ 429s


def test_a_lone_429_blocks_both_lanes_and_empties_the_buckets_without_slowing_the_rate() -> None:
    adm, clock = admission()
    limits = Limits(rpm=600)
    for _ in range(100):  # the calls of the last while
        clock.now += 0.11
        assert adm.acquire(demand(), limits).granted
    adm.penalise(MODEL, 5.0)
    for priority in PRIORITIES:
        blocked = adm.acquire(demand(0, priority), limits)
        assert not blocked.granted and blocked.reason == "penalty"
        assert blocked.wait == pytest.approx(5.0)
    assert adm.use([MODEL])[0].slowed == 1.0
    assert adm.use([MODEL])[0].blocked_seconds == pytest.approx(5.0)
    clock.now += 4.9
    assert not adm.acquire(demand(), limits).granted  # nothing refilled while blocked
    clock.now += 0.1
    # From an empty bucket, at the whole rate: 9.8 a second.
    granted = 0
    for _ in range(100):
        clock.now += 0.05
        granted += adm.acquire(demand(), limits).granted
    assert granted == pytest.approx(9.8 * 5, abs=2)
    assert adm.use([MODEL])[0].blocked_seconds == 0.0


def test_each_429_after_the_first_slows_the_rate_by_its_share_of_the_calls() -> None:
    adm, clock = admission()
    limits = Limits(rpm=6_000)  # a burst of 98
    for _ in range(90):
        assert adm.acquire(demand(), limits).granted
    for _ in range(10):
        adm.penalise(MODEL, 0.0)
    # Nine 429s past the first, among the ninety calls granted: a tenth of the rate.
    assert adm.use([MODEL])[0].slowed == pytest.approx(0.9)
    clock.now += am.RECOVERY_SECONDS * 0.05
    assert adm.use([MODEL])[0].slowed == pytest.approx(0.95)  # recovering linearly
    clock.now += am.RECOVERY_SECONDS
    assert adm.use([MODEL])[0].slowed == 1.0


def test_429s_among_few_calls_slow_the_rate_down_to_a_floor() -> None:
    adm, _ = admission()
    for _ in range(5):
        adm.penalise(MODEL, 0.0)
    assert adm.use([MODEL])[0].slowed == am.MIN_SLOW


def test_the_evidence_of_429s_fades() -> None:
    """A 429 a minute after the last ones is a lone one again."""
    adm, clock = admission()
    limits = Limits(rpm=6_000)
    for _ in range(20):
        assert adm.acquire(demand(), limits).granted
    adm.penalise(MODEL, 0.0)
    adm.penalise(MODEL, 0.0)
    assert adm.use([MODEL])[0].slowed == pytest.approx(1 - 1 / 20)
    clock.now += 10 * am.EVIDENCE_HALF_LIFE_SECONDS  # recovered, and the 429s forgotten
    for _ in range(20):
        assert adm.acquire(demand(), limits).granted
    adm.penalise(MODEL, 0.0)
    assert adm.use([MODEL])[0].slowed == pytest.approx(1.0, abs=1e-3)


def test_a_lone_429_at_the_start_of_a_backlog_costs_little() -> None:
    """Issue 42: 300 batch calls at 1,200 rpm, one refused at once.  Its cost is its block
    and the buckets it emptied, not half the rate for the whole backlog (which took twice
    the floor of 15 s)."""
    granted = _backlog(calls=300, refused_after=17)
    floor = 300 / (1_200 / 60)
    assert max(granted) < floor / am.HEADROOM + 1.0, max(granted)


def _backlog(calls: int, refused_after: int) -> list[float]:
    """``calls`` batch calls asked at once at 1,200 rpm, each refused one coming back at
    its wait; the grant number ``refused_after`` is refused by the provider (a 429 with
    a retry-after of 50 ms) and asks again then.  Returns when each call was granted, in
    seconds from the start."""
    adm, clock = admission()
    limits = Limits(rpm=1_200)
    queue = [(clock.now, n) for n in range(calls)]
    heapq.heapify(queue)
    start, seq, refused = clock.now, calls, False
    granted: list[float] = []
    while queue:
        clock.now, _ = heapq.heappop(queue)
        grant = adm.acquire(demand(0, "batch", "acme"), limits)
        if grant.granted and len(granted) + 1 == refused_after and not refused:
            refused = True
            adm.penalise(MODEL, 0.05)
            heapq.heappush(queue, (clock.now + 0.05, seq))
        elif grant.granted:
            granted.append(clock.now - start)
        else:
            heapq.heappush(queue, (clock.now + grant.wait, seq))
        seq += 1
    return granted


# ------------------------------------------------------------------ what the provider says


def test_a_report_holds_the_buckets_to_what_the_provider_has_less_what_is_on_its_way() -> None:
    adm, _ = admission()
    limits = Limits(rpm=600, tpm=60_000)  # bursts of 9.8 requests and 980 tokens
    first = adm.acquire(demand(100), limits)
    for _ in range(3):  # granted after it: on their way to the provider
        assert adm.acquire(demand(100), limits).granted
    adm.observe(first, ProviderReport(requests_remaining=2, tokens_remaining=300))
    use = adm.use([MODEL])[0]
    assert use.requests_available == pytest.approx(2 - 3)
    assert use.tokens_available == pytest.approx(300 - 300)


def test_a_report_of_more_than_the_buckets_hold_changes_nothing() -> None:
    adm, _ = admission()
    limits = Limits(rpm=600, tpm=60_000)
    grant = adm.acquire(demand(100), limits)
    before = adm.use([MODEL])[0]
    adm.observe(grant, ProviderReport(requests_remaining=500, tokens_remaining=90_000))
    adm.observe(grant, ProviderReport())  # a provider that says nothing
    assert adm.use([MODEL])[0] == before


def test_a_report_of_a_refused_call_or_of_a_forgotten_state_changes_nothing() -> None:
    adm, _ = admission()
    limits = Limits(rpm=60)
    assert adm.acquire(demand(), limits).granted
    refused = adm.acquire(demand(), limits)
    assert not refused.granted
    adm.observe(refused, ProviderReport(requests_remaining=0))
    assert adm.use([MODEL])[0].requests_available == pytest.approx(0)
    grant = Grant(demand=demand(), granted=True, requests_mark=1)
    adm.observe(
        replace(grant, demand=replace(grant.demand, model="unseen")),
        ProviderReport(requests_remaining=0),
    )
    assert adm.use(["unseen"])[0].requests_available is None


def test_an_account_another_client_shares_costs_capacity_not_429s() -> None:
    """Another client of the account takes a quarter of its rate: each answer says what
    the provider has left, and the fleet is held to it instead of finding out by 429s."""
    refused, took = _against_a_shared_account(calls=300, reports=True)
    blind, _ = _against_a_shared_account(calls=300, reports=False)
    assert refused <= 2, refused
    assert blind > 10 * max(1, refused), blind
    assert took < 300 / 15 + 2, took  # at about what the other client leaves: 15 a second


def _against_a_shared_account(calls: int, reports: bool) -> tuple[int, float]:
    """``calls`` interactive calls of a backlog at 1,200 rpm against a provider holding a
    second of its rate, of which another client takes 5 calls a second; each call reaches
    it 20 ms after its grant and is answered at once (with what it has left, if
    ``reports``), a refused one penalised and asked again after its retry-after.  Returns
    how many the provider refused, and when the last call was admitted."""
    adm, clock = admission()
    limits = Limits(rpm=1_200)
    start, refill = clock.now, 20.0 - 5.0
    provider = {"level": 20.0, "at": clock.now}
    events: list[tuple[float, int, Grant | None]] = [(clock.now, n, None) for n in range(calls)]
    heapq.heapify(events)
    seq, refused, last = calls, 0, 0.0
    while events:
        clock.now, _, arriving = heapq.heappop(events)
        if arriving is None:  # a call asks for capacity
            grant = adm.acquire(demand(), limits)
            due = clock.now + (0.02 if grant.granted else grant.wait)
            heapq.heappush(events, (due, seq, grant if grant.granted else None))
        else:  # a granted call reaches the provider
            level = min(20.0, provider["level"] + (clock.now - provider["at"]) * refill)
            provider["at"] = clock.now
            if level >= 1:
                provider["level"], last = level - 1, clock.now - start
                if reports:
                    adm.observe(arriving, ProviderReport(requests_remaining=math.floor(level - 1)))
            else:
                provider["level"] = level
                refused += 1
                adm.penalise(MODEL, (1 - level) / refill)
                heapq.heappush(events, (clock.now + (1 - level) / refill, seq, None))
        seq += 1
    return refused, last


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
    # One interactive call, then batch calls while they leave 1 + 1 requests.
    assert use[0].requests_available == pytest.approx(9.8 - 8)
    assert use[0].tokens_available == pytest.approx(980 - 800)
    assert set(use[0].waiting_tenants) == {"acme"} and use[0].waiting_tenants["acme"] > 1
    assert use[1].limits is None and use[1].waiting_tenants == {}
    assert adm.use([MODEL]) == adm.use([MODEL])
    clock.now += 0.5
    assert adm.use([MODEL])[0].requests_available == pytest.approx(1.8 + 4.9)


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

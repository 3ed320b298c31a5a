"""The admission port's contract (:class:`parley.ports.admission.Admission`), one suite for
both implementations: the tests that take ``admission`` run against the in-process one
and against the Redis one on the tests' Redis database, and must give the same answers
(to within the few milliseconds between their clocks: the waits scripted here are
large).  The arithmetic itself is tested in tests/unit/test_admission_math.py.

What only Redis has is tested here too: a flushed database rebuilds full buckets (the
bound: one more burst) and gets back the learned limits its callers saw, every key of a
model is in its hash slot and expires, a server that lost the script gets it again, a
call is one round trip, many processes share the buckets atomically, and a Redis out of
reach is told apart."""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from parley.coordination import admission_feedback as feedback
from parley.coordination import admission_math as am
from parley.coordination import constants as c
from parley.coordination.local_admission import LocalAdmission
from parley.coordination.redis_admission import AdmissionUnreachable, RedisAdmission
from parley.ports.admission import Admission, Demand, Grant, Limits, Priority, ProviderReport
from parley.schemas.errors import InvalidRequest
from tests.support.fleet import REDIS_TEST_URL, flush_redis
from tests.support.redis_cluster import RedisClusterNodes

CLOCKS_APART = 0.05
"""How far apart two runs of the same script may answer in seconds: the time between
their calls (the waits scripted are a second and more)."""


@pytest.fixture(params=["local", "redis", "cluster"])
def admission(request: pytest.FixtureRequest) -> Iterator[Admission]:
    """Each implementation in turn: in process, on the tests' emptied Redis database, and
    on the run's emptied Redis Cluster."""
    if request.param == "local":
        yield LocalAdmission()
        return
    if request.param == "cluster":
        nodes: RedisClusterNodes = request.getfixturevalue("cluster_nodes")
        nodes.flushall()
        url = nodes.url
    else:
        flush_redis(REDIS_TEST_URL)
        url = REDIS_TEST_URL
    chosen = RedisAdmission(url)
    try:
        yield chosen
    finally:
        chosen.close()


@pytest.fixture
def redis_admission() -> Iterator[RedisAdmission]:
    flush_redis(REDIS_TEST_URL)
    chosen = RedisAdmission(REDIS_TEST_URL)
    try:
        yield chosen
    finally:
        chosen.close()


def model_name() -> str:
    return f"test:{uuid.uuid4().hex[:8]}"


def ask(
    model: str, tokens: int, priority: Priority = "interactive", tenant: str = "", weight: float = 1
) -> Demand:
    return Demand(model=model, tokens=tokens, priority=priority, tenant=tenant, weight=weight)


# ------------------------------------------------------------------ the same answers


def test_a_scripted_sequence_gets_the_same_answers_from_both(admission: Admission) -> None:
    """60 rpm / 6,000 tpm: 0.98 requests a second (a burst of one) and 98 tokens a second
    (a burst of 98).  Each answer is what admission_math's docstring says."""
    model = model_name()
    limits = Limits(rpm=60, tpm=6_000)
    r_gap = 1 / (60 / 60 * am.HEADROOM)  # seconds per request
    first = admission.acquire(ask(model, 50), limits)
    assert (first.granted, first.tokens, first.wait, first.learned) == (True, 50, 0.0, None)
    second = admission.acquire(ask(model, 10), limits)
    assert (second.granted, second.reason) == (False, "requests")
    assert second.wait == pytest.approx(r_gap, abs=CLOCKS_APART)
    # Batch calls step aside for the interactive one, plus the grace.
    aside = r_gap + am.INTERACTIVE_GRACE_SECONDS
    a1 = admission.acquire(ask(model, 10, "batch", "a"), limits)
    assert (a1.granted, a1.reason) == (False, "interactive")
    assert a1.wait == pytest.approx(aside, abs=CLOCKS_APART)
    # a's next ticket, at half the rate: the tenant "" waits too (its interactive call).
    a2 = admission.acquire(ask(model, 10, "batch", "a"), limits)
    assert a2.wait == pytest.approx(aside + 2 * r_gap, abs=CLOCKS_APART)
    b1 = admission.acquire(ask(model, 10, "batch", "b", 3), limits)  # b's clock starts now
    assert b1.wait == pytest.approx(aside, abs=CLOCKS_APART)
    b2 = admission.acquire(ask(model, 10, "batch", "b", 3), limits)  # at 3/5 of the rate
    assert b2.wait == pytest.approx(aside + r_gap / 0.6, abs=CLOCKS_APART)
    admission.settle(first, 20)  # 30 tokens back: 48 + 30
    # The provider says what it has left: 80 tokens; nothing was granted after the first
    # call, and ours hold 78 already; then 60, which they are held to.
    admission.observe(first, ProviderReport(tokens_remaining=80))
    assert admission.use([model])[0].tokens_available == pytest.approx(78, abs=98 * CLOCKS_APART)
    admission.observe(first, ProviderReport(requests_remaining=0, tokens_remaining=60))
    use = admission.use([model])[0]
    assert use.limits == limits and use.learned is None
    assert use.tokens_available == pytest.approx(60, abs=98 * CLOCKS_APART)
    assert use.requests_available == pytest.approx(0, abs=CLOCKS_APART)
    assert use.slowed == 1.0 and use.blocked_seconds == 0.0
    assert set(use.waiting_tenants) == {"", "a", "b"}
    assert use.waiting_tenants["a"] == pytest.approx(aside + 4 * r_gap, abs=CLOCKS_APART)
    admission.penalise(model, 2.0)
    blocked = admission.acquire(ask(model, 10, "batch", "a"), limits)
    assert (blocked.granted, blocked.reason) == (False, "penalty")
    assert blocked.wait == pytest.approx(2.0, abs=CLOCKS_APART)
    admission.learn(model, Limits(rpm=120))
    admission.learn(model, Limits(tpm=9_000))
    learned = admission.acquire(ask(model, 10), None)
    assert (learned.granted, learned.reason, learned.learned) == (
        False,
        "penalty",
        Limits(rpm=120, tpm=9_000),
    )
    use = admission.use([model])[0]
    assert use.slowed == 1.0  # a lone 429: blocked, not slowed
    assert use.blocked_seconds == pytest.approx(2.0, abs=CLOCKS_APART)
    assert use.limits == Limits(rpm=120, tpm=9_000)  # in force at the latest acquire
    assert use.tokens_available is not None and use.tokens_available <= 0


def test_with_no_limit_known_calls_go_at_once_and_settle_to_nothing(admission: Admission) -> None:
    model = model_name()
    for priority in ("interactive", "batch", "batch"):
        grant = admission.acquire(ask(model, 10**6, priority, "t"), None)
        assert (grant.granted, grant.wait, grant.tokens, grant.learned) == (True, 0.0, 0, None)
        admission.settle(grant, 10**7)
    (use,) = admission.use([model])
    assert (use.limits, use.requests_available, use.tokens_available) == (None, None, None)


def test_a_model_nobody_asked_about_is_reported_empty(admission: Admission) -> None:
    (use,) = admission.use([model_name()])
    assert use.limits is None and use.learned is None and use.waiting_tenants == {}
    assert use.slowed == 1.0 and use.blocked_seconds == 0.0


def test_many_callers_at_once_never_take_more_than_the_bucket_holds(
    admission: Admission,
) -> None:
    """Eight threads (for Redis, eight clients: eight processes) ask at once."""
    model = model_name()
    limits = Limits(rpm=600)  # a burst of 9.8, 9.8 a second
    clients: list[Admission] = [admission] * 8
    if isinstance(admission, RedisAdmission):
        clients = [RedisAdmission(REDIS_TEST_URL) for _ in range(8)]
    granted: list[float] = []
    start = threading.Barrier(8)
    begun = time.monotonic()

    def hammer(client: Admission) -> None:
        start.wait()
        for _ in range(30):
            if client.acquire(ask(model, 0), limits).granted:
                granted.append(time.monotonic())

    threads = [threading.Thread(target=hammer, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for client in clients:
        if isinstance(client, RedisAdmission) and client is not admission:
            client.close()
    elapsed = max(granted) - begun
    assert 9 <= len(granted) <= 9.8 + 9.8 * elapsed + 1e-6


@pytest.mark.parametrize(
    "bad",
    [
        ask("m", -1),
        ask("", 1),
        Demand(model="m", tokens=1, priority="urgent"),  # type: ignore[arg-type]
        ask("m", 1, "batch", "t", 0),
    ],
)
def test_bad_input_is_refused_alike(admission: Admission, bad: Demand) -> None:
    with pytest.raises(InvalidRequest):
        admission.acquire(bad, None)
    with pytest.raises(InvalidRequest, match="retry_after"):
        admission.penalise("m", -1.0)
    model = model_name()
    grant = admission.acquire(ask(model, 0), Limits(rpm=600))
    before = admission.use([model])
    for report in (
        ProviderReport(requests_remaining=-1),
        ProviderReport(tokens_remaining=1.5),  # type: ignore[arg-type]
        ProviderReport(requests_remaining=True),
    ):
        with pytest.raises(InvalidRequest, match="remaining"):
            admission.observe(grant, report)
    assert admission.use([model])[0].requests_available == pytest.approx(
        before[0].requests_available, abs=9.8 * CLOCKS_APART
    )


# ------------------------------------------------------------------ Redis only

STEP = st.one_of(
    st.tuples(
        st.just("acquire"),
        st.sampled_from(["interactive", "batch", "batch", "batch"]),  # batch: tenants' turns
        st.sampled_from([("a", 1.0), ("b", 3.0), ("c", 0.5)]),
        st.integers(0, 400),
        st.sampled_from(
            [None, Limits(rpm=600, tpm=60_000), Limits(rpm=6_000, tpm=600_000), Limits(rpm=60_000)]
        ),
    ),
    st.tuples(st.just("settle"), st.integers(0, 20), st.integers(0, 800)),
    st.tuples(
        st.just("observe"),
        st.integers(0, 20),
        st.one_of(st.none(), st.integers(0, 30)),
        st.one_of(st.none(), st.integers(0, 3_000)),
    ),
    st.tuples(st.just("penalise")),
    st.tuples(st.just("learn"), st.sampled_from([Limits(rpm=20_000), Limits(tpm=500_000)])),
    st.tuples(st.just("sleep"), st.floats(0, 0.03)),
)


def _replay(state: am.ModelState, step: tuple[Any, ...], stored: am.ModelState) -> am.Answer:
    """Apply ``step`` to the Python state at the time the script used (which the stored
    state tells: an acquire or settle leaves it as ``at``, a penalty as ``slowed_at``)."""
    if step[0] == "acquire":
        _, priority, (tenant, weight), tokens, configured = step
        assert stored.at is not None
        return am.acquire(state, ask("m", tokens, priority, tenant, weight), configured, stored.at)
    if step[0] == "settle":
        if stored.at is not None:
            feedback.settle(state, step[1], step[2], stored.at)
    elif step[0] == "observe":
        if stored.at is not None:
            grant, report = step[1], step[2]
            feedback.observe(state, report, grant.requests_mark, grant.tokens_mark, stored.at)
    elif step[0] == "penalise":
        feedback.penalise(state, 0.0, stored.slowed_at)
    else:
        feedback.learn(state, step[1])
    return am.Answer(granted=True)


def _check_alike(redis_admission: RedisAdmission, steps: list[tuple[Any, ...]]) -> list[Grant]:
    """Run ``steps`` on Redis and each on admission_math at the instant the script read
    from TIME; assert the same answer and the same state, to the last bit.  Returns the
    grants (and refusals) Redis gave."""
    model = model_name()
    mirror = am.ModelState()
    outstanding: list[Grant] = []
    answers: list[Grant] = []
    for step in steps:
        if step[0] == "acquire":
            _, priority, (tenant, weight), tokens, configured = step
            grant = redis_admission.acquire(
                ask(model, tokens, priority, tenant, weight), configured
            )
            answers.append(grant)
            if grant.granted:
                outstanding.append(grant)
        elif step[0] == "settle":
            if not outstanding:
                continue
            grant = outstanding.pop(step[1] % len(outstanding))
            redis_admission.settle(grant, step[2])
            if not grant.tokens:
                continue  # nothing sent: nothing to replay
            step = ("settle", grant.tokens, step[2])
        elif step[0] == "observe":
            if not outstanding:
                continue
            grant = outstanding[step[1] % len(outstanding)]
            report = ProviderReport(requests_remaining=step[2], tokens_remaining=step[3])
            redis_admission.observe(grant, report)
            step = ("observe", grant, report)
        elif step[0] == "penalise":
            redis_admission.penalise(model, 0.0)
        elif step[0] == "sleep":
            time.sleep(step[1])  # the buckets refill meanwhile, on Redis's clock
            continue
        else:
            redis_admission.learn(model, step[1])
        stored = redis_admission.state(model)
        expected = copy.deepcopy(mirror)
        answer = _replay(expected, step, stored)
        if step[0] == "acquire":
            assert (grant.granted, grant.wait, grant.tokens, grant.reason) == (
                answer.granted,
                answer.wait,
                answer.tokens,
                answer.reason,
            ), step
        assert stored == expected, step
        mirror = expected
    return answers


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(STEP, min_size=1, max_size=60))
def test_the_script_computes_exactly_what_the_python_arithmetic_does(
    redis_admission: RedisAdmission, steps: list[tuple[Any, ...]]
) -> None:
    """Random steps, each checked against the Python arithmetic.  (Low limits, for calls
    to wait, and high ones, for the milliseconds between steps to refill the buckets.
    Penalties without a block: a block's end would hide the script's time.)"""
    _check_alike(redis_admission, steps)


def test_the_script_takes_tenants_turns_exactly_as_the_python_arithmetic_does(
    redis_admission: RedisAdmission,
) -> None:
    """A sequence random steps seldom reach: both tenants wait, capacity comes back, the
    first tenant is granted, and its next call is out of its turn while the other's is
    granted; then a tenant that never waited is granted."""
    limits = Limits(rpm=600)  # a burst of 9.8; batch calls leave one request
    a = ("acquire", "batch", ("a", 1.0), 0, limits)
    b = ("acquire", "batch", ("b", 1.0), 0, limits)
    c = ("acquire", "batch", ("c", 1.0), 0, limits)  # never waited: no service kept
    steps = [a] * 9 + [b, ("sleep", 0.25), a, a, b, ("sleep", 0.3), c]
    answers = _check_alike(redis_admission, steps)
    assert [g.granted for g in answers] == [True] * 8 + [False, False, True, False, True, True]


def test_a_flushed_database_rebuilds_full_buckets_and_its_learned_limits(
    redis_admission: RedisAdmission,
) -> None:
    """The bound after a flush: one more burst.  In a window with a flush in it, the
    requests granted are at most 2 * burst + rate * W.  (FLUSHDB on the tests' database,
    never FLUSHALL on a shared server: the same loss to admission.)"""
    model = model_name()
    limits = Limits(rpm=600)  # a burst of 9.8
    redis_admission.learn(model, Limits(tpm=60_000))
    begun = time.monotonic()
    before = sum(redis_admission.acquire(ask(model, 0), limits).granted for _ in range(30))
    assert 9 <= before <= 9.8 + 9.8 * (time.monotonic() - begun) + 1e-6
    flush_redis(REDIS_TEST_URL)
    other = RedisAdmission(REDIS_TEST_URL)  # another process, that never saw the limits
    try:
        assert other.acquire(ask(model, 10), None).learned is None
        after = sum(redis_admission.acquire(ask(model, 0), limits).granted for _ in range(30))
        elapsed = time.monotonic() - begun
        assert 9 <= after <= 9 + 9.8 * elapsed + 1
        assert before + after <= 2 * 9.8 + 9.8 * elapsed + 1e-6
        # The first admission put back the learned limits it saw; everyone has them again.
        assert other.acquire(ask(model, 10), None).learned == Limits(tpm=60_000)
    finally:
        other.close()


def test_every_key_of_a_model_is_in_its_hash_slot_and_expires(
    redis_admission: RedisAdmission,
) -> None:
    model = "openai:gpt-4o-mini"
    limits = Limits(rpm=60, tpm=6_000)
    redis_admission.learn(model, Limits(rpm=60))
    for tenant in ("a", "b"):
        for _ in range(3):
            redis_admission.acquire(ask(model, 10, "batch", tenant), limits)
    redis_admission.acquire(ask(model, 10, "interactive", "c"), limits)  # (told to wait)
    redis_admission.penalise(model, 1.0)
    client: Any = redis.Redis.from_url(REDIS_TEST_URL)
    try:
        keys = sorted(key.decode() for key in client.keys("*"))
        assert keys == sorted(
            [
                c.admission_key(model),
                c.admission_tickets_key(model),
                c.admission_weights_key(model),
                c.admission_served_key(model),
                c.admission_interactive_key(model),
            ]
        )
        assert all(key.startswith("parley:adm:{openai:gpt-4o-mini}") for key in keys)
        assert redis_admission.models() == [model]  # the companions are not models
        assert len({key_slot(key.encode()) for key in keys}) == 1
        for key in keys:
            assert 0 < client.ttl(key) <= c.ADMISSION_STATE_SECONDS
    finally:
        client.close()


def test_a_server_that_lost_the_script_gets_it_loaded_again(
    redis_admission: RedisAdmission,
) -> None:
    model = model_name()
    limits = Limits(rpm=60)
    assert redis_admission.acquire(ask(model, 0), limits).granted
    redis_admission.client.script_flush()  # what a restarted server knows of it
    refused = redis_admission.acquire(ask(model, 0), limits)
    assert not refused.granted and refused.reason == "requests"  # the state was kept
    redis_admission.client.script_flush()
    redis_admission.penalise(model, 1.0)
    redis_admission.client.script_flush()
    redis_admission.learn(model, Limits(tpm=1_000))
    assert redis_admission.use([model])[0].learned == Limits(rpm=None, tpm=1_000)


def test_each_call_is_one_round_trip(
    redis_admission: RedisAdmission, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = model_name()
    limits = Limits(rpm=6_000, tpm=600_000)
    redis_admission.acquire(ask(model, 0), limits)  # connected, the script loaded
    sent: list[object] = []
    original: Any = redis.connection.AbstractConnection.send_packed_command

    def counted(self: Any, command: object, check_health: bool = True) -> None:
        sent.append(command)
        original(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    grant = redis_admission.acquire(ask(model, 100), limits)
    assert len(sent) == 1
    redis_admission.settle(grant, 50)
    assert len(sent) == 2
    redis_admission.acquire(ask(model, 100, "batch", "t"), limits)
    assert len(sent) == 3
    redis_admission.observe(grant, ProviderReport(requests_remaining=3, tokens_remaining=300))
    assert len(sent) == 4
    redis_admission.penalise(model, 0.5)
    redis_admission.learn(model, Limits(rpm=6_000))
    assert len(sent) == 6
    redis_admission.use([model, model_name(), model_name()])  # every model, one pipeline
    assert len(sent) == 7


def test_a_redis_out_of_reach_is_told_apart() -> None:
    """Nothing listens on port 1: every call raises AdmissionUnreachable, which is a
    redis.ConnectionError, and says which call could not reach Redis."""
    unreachable = RedisAdmission("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(AdmissionUnreachable, match="admission could not reach Redis"):
            unreachable.acquire(ask("m", 1), Limits(rpm=60))
        with pytest.raises(redis.ConnectionError):
            unreachable.penalise("m", 1.0)
        with pytest.raises(AdmissionUnreachable, match="admission could not read Redis"):
            unreachable.use(["m"])
    finally:
        unreachable.close()


def test_a_shared_client_is_not_closed_with_the_admission() -> None:
    client: Any = redis.Redis.from_url(REDIS_TEST_URL)
    try:
        shared = RedisAdmission(client)
        shared.close()
        assert client.ping()
    finally:
        client.close()

"""The engine's side of admission (src/parley/engine/call_admission.py) on the in-process
admission and a clock the test moves: a model whose limits nobody knows is probed (its
calls in this process go one at a time, a probe that takes long holds the others at most
``PROBE_SECONDS``, a throttle or a failure lets the next one go); an admission out of
reach lets every call go, and says so once; a 429 caps its wait and gives its tokens back
before it penalises the model; and the settings refuse what they cannot mean.

The probe's waiters are real threads (the probe is a semaphore between them); the clock
they measure ``PROBE_SECONDS`` on is the test's, so only the test's moves end a wait."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import pytest

from parley.coordination.local_admission import LocalAdmission
from parley.coordination.redis_admission import RedisAdmission
from parley.engine.call_admission import (
    DEFAULT_MAX_RETRY_AFTER,
    PROBE_SECONDS,
    AdmissionSettings,
    CallAdmission,
    Throttle,
)
from parley.ports.admission import Demand, Grant, Limits, ProviderReport
from parley.ports.host import ModelReply, ModelThrottled
from parley.schemas.errors import InvalidRequest
from parley.schemas.records import Usage

MODEL = "openai:gpt-test"
HELD_SECONDS = 0.4
"""How long a waiter is watched to see that it still waits (it asks every 0.1 s)."""
DONE_SECONDS = 10.0
"""How long a waiter let go may take to return (generous: the machine is shared)."""

T = TypeVar("T")


class Clock:
    """Seconds that move only when the test moves them, or a wait sleeps them."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def local(clock: Clock) -> LocalAdmission:
    return LocalAdmission(clock=clock)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4) as executor:
        yield executor


def gate_of(
    clock: Clock,
    admission: LocalAdmission | RedisAdmission,
    *,
    settings: AdmissionSettings | None = None,
    limits: dict[str, Limits] | None = None,
) -> CallAdmission:
    return CallAdmission(
        admission,
        settings or AdmissionSettings(),
        limits or {},
        sleep=clock.sleep,
        clock=clock,
    )


def ask(tokens: int = 100) -> Demand:
    return Demand(model=MODEL, tokens=tokens)


def go_on() -> None:
    """A turn nobody interrupts."""


class Interrupted(Exception):
    pass


def interrupt() -> None:
    raise Interrupted


def answer(limits: Limits | None) -> ModelReply:
    return ModelReply(
        text="ok", usage=Usage(input_tokens=10, output_tokens=5), model=MODEL, limits=limits
    )


def granted(result: Grant | Throttle) -> Grant:
    assert isinstance(result, Grant) and result.granted, result
    return result


def still_waiting(future: Future[T]) -> bool:
    time.sleep(HELD_SECONDS)
    return not future.done()


def admit_in(pool: ThreadPoolExecutor, gate: CallAdmission) -> Future[Grant | Throttle]:
    return pool.submit(gate.admit, ask(), go_on)


def let_go(clock: Clock) -> Callable[[], None]:
    """What frees a waiter the test expected not to wait: the probe's time passes."""

    def free() -> None:
        clock.now += PROBE_SECONDS + 1

    return free


# ------------------------------------------------------------------------ the probe


def test_calls_of_a_model_no_one_knows_go_one_at_a_time_until_an_answer_states_its_limits(
    clock: Clock, local: LocalAdmission, pool: ThreadPoolExecutor
) -> None:
    gate = gate_of(clock, local)
    first = granted(gate.admit(ask(), go_on))  # the probe
    second = admit_in(pool, gate)
    assert still_waiting(second), "a second call went while the probe was out"
    gate.settle(first, answer(Limits(rpm=600)))
    granted(second.result(DONE_SECONDS))
    # Known now: the calls go together, none waiting for another's answer.
    together = [admit_in(pool, gate) for _ in range(3)]
    for future in together:
        granted(future.result(DONE_SECONDS))
    assert gate.limits_of(MODEL) == Limits(rpm=600)
    assert clock.slept == []


def test_an_answer_that_states_no_limits_ends_the_probe_for_good(
    clock: Clock, local: LocalAdmission, pool: ThreadPoolExecutor
) -> None:
    gate = gate_of(clock, local)
    first = granted(gate.admit(ask(), go_on))
    second = admit_in(pool, gate)
    assert still_waiting(second)
    gate.settle(first, answer(None))  # a scripted model, a local server
    granted(second.result(DONE_SECONDS))
    together = [admit_in(pool, gate) for _ in range(3)]
    for future in together:
        granted(future.result(DONE_SECONDS))
    assert gate.limits_of(MODEL) is None


def test_a_probe_that_takes_longer_than_probe_seconds_does_not_hold_the_others(
    clock: Clock, local: LocalAdmission, pool: ThreadPoolExecutor
) -> None:
    gate = gate_of(clock, local)
    granted(gate.admit(ask(), go_on))  # a long answer: not settled in this test
    second = admit_in(pool, gate)
    clock.now += PROBE_SECONDS - 0.5
    assert still_waiting(second), "the wait for the probe ended early"
    clock.now += 0.6
    granted(second.result(DONE_SECONDS))


def test_a_probe_told_to_wait_lets_the_next_call_go(
    clock: Clock, local: LocalAdmission, pool: ThreadPoolExecutor
) -> None:
    gate = gate_of(clock, local)
    local.penalise(MODEL, 30.0)  # a 429 another caller got: nothing goes for 30 s
    throttle = gate.admit(ask(), go_on)
    assert isinstance(throttle, Throttle), throttle
    assert throttle.reason == "penalty"
    assert throttle.seconds == pytest.approx(30.0)
    # The clock stands still: only the throttle's letting go of the probe frees this one.
    second = admit_in(pool, gate)
    try:
        assert isinstance(second.result(DONE_SECONDS), Throttle)
    finally:
        let_go(clock)()


@pytest.mark.parametrize("how", ["the call failed", "interrupted while it waited"])
def test_a_probe_that_fails_lets_the_next_call_go(
    how: str, clock: Clock, local: LocalAdmission, pool: ThreadPoolExecutor
) -> None:
    gate = gate_of(clock, local)
    if how == "the call failed":
        grant = granted(gate.admit(ask(), go_on))
        gate.unused(grant, ask())
    else:
        local.penalise(MODEL, 0.5)  # a wait short enough to spend in the slot
        with pytest.raises(Interrupted):
            gate.admit(ask(), interrupt)
    second = admit_in(pool, gate)
    try:
        granted(second.result(DONE_SECONDS))
    finally:
        let_go(clock)()


def test_a_probe_ends_when_the_answer_begins_stating_its_limits(
    clock: Clock, local: LocalAdmission, pool: ThreadPoolExecutor
) -> None:
    """The headers come before the first token: the next calls need not wait for the
    probe's whole answer (issue 42: a second of one call per worker at a cold start)."""
    gate = gate_of(clock, local)
    first = granted(gate.admit(ask(), go_on))
    second = admit_in(pool, gate)
    assert still_waiting(second)
    gate.observe(first, ProviderReport(limits=Limits(rpm=600), requests_remaining=599))
    granted(second.result(DONE_SECONDS))  # the probe's answer is still streaming
    assert gate.limits_of(MODEL) == Limits(rpm=600)


def test_headers_that_state_nothing_end_the_probe_for_good(
    clock: Clock, local: LocalAdmission, pool: ThreadPoolExecutor
) -> None:
    gate = gate_of(clock, local)
    first = granted(gate.admit(ask(), go_on))
    second = admit_in(pool, gate)
    assert still_waiting(second)
    gate.observe(first, ProviderReport())
    granted(second.result(DONE_SECONDS))
    together = [admit_in(pool, gate) for _ in range(3)]
    for future in together:
        granted(future.result(DONE_SECONDS))


class CountingAdmission(LocalAdmission):
    """The in-process admission, counting the reports it was passed."""

    observed = 0

    def observe(self, grant: Grant, report: ProviderReport) -> None:
        self.observed += 1
        super().observe(grant, report)


@pytest.mark.parametrize(
    ("remaining", "passed"),
    [(5, True), (19, True), (20, False), (1_200, False)],  # bursts of 9.8: reach 19.6
)
def test_a_report_is_passed_on_when_what_is_left_is_within_reach_of_the_buckets(
    remaining: int, passed: bool, clock: Clock
) -> None:
    """A provider whose bucket holds a minute (OpenAI's) says it has far more left than
    ours hold: its reports cost no round trip, and would lower nothing anyway."""
    counting = CountingAdmission(clock=clock)
    gate = gate_of(clock, counting, limits={MODEL: Limits(rpm=600)})
    grant = granted(gate.admit(ask(), go_on))
    gate.observe(grant, ProviderReport(requests_remaining=remaining))
    assert counting.observed == int(passed)
    available = counting.use([MODEL])[0].requests_available
    assert available == pytest.approx(min(8.8, remaining))


# ------------------------------------------------------------------------ out of reach


def test_an_admission_out_of_reach_lets_every_call_go_and_says_so_once(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listens on port 1: every method of the Redis admission raises
    AdmissionUnreachable; no call waits or fails for it, and one warning says so."""
    unreachable = RedisAdmission("redis://127.0.0.1:1/0")
    gate = gate_of(clock, unreachable, limits={MODEL: Limits(rpm=1)})
    try:
        with caplog.at_level(logging.INFO, logger="parley.admission"):
            grants = [granted(gate.admit(ask(), go_on)) for _ in range(3)]
            gate.settle(grants[0], answer(Limits(rpm=1)))
            gate.unused(grants[1], ask())
            assert gate.refused(grants[2], ModelThrottled("429", retry_after=2.0)) == 2.0
            granted(gate.admit(ask(), go_on))
    finally:
        unreachable.close()
    warnings = [r for r in caplog.records if r.name == "parley.admission"]
    assert [r.levelno for r in warnings] == [logging.WARNING], [r.message for r in warnings]
    assert "calls go ahead unadmitted" in warnings[0].getMessage()
    assert "AdmissionUnreachable" in warnings[0].getMessage()
    assert clock.slept == []  # (the refusal's wait is the engine's, not admission's)


# ------------------------------------------------------------------------ a 429


@pytest.mark.parametrize(
    ("retry_after", "waits"), [(120.0, 5.0), (2.0, 2.0), (None, 1.0), (-3.0, 0.0)]
)
def test_a_refusal_waits_the_providers_retry_after_capped_by_max_retry_after(
    retry_after: float | None, waits: float, clock: Clock, local: LocalAdmission
) -> None:
    gate = gate_of(
        clock,
        local,
        settings=AdmissionSettings(max_retry_after=5.0),
        limits={MODEL: Limits(rpm=60, tpm=60_000)},
    )
    grant = granted(gate.admit(ask(), go_on))
    assert gate.refused(grant, ModelThrottled("429", retry_after=retry_after)) == waits
    [use] = local.use([MODEL])
    assert use.blocked_seconds == pytest.approx(waits)
    assert use.slowed == 1.0  # a lone 429 blocks the model; it does not slow it


def test_a_refusal_gives_its_tokens_back_before_the_penalty_empties_the_buckets(
    clock: Clock, local: LocalAdmission
) -> None:
    """Settled after the penalty, the reserved tokens would go back into a bucket that
    must stay empty until the retry-after ends: the first call after it would find them."""
    gate = gate_of(clock, local, limits={MODEL: Limits(rpm=60, tpm=60_000)})
    grant = granted(gate.admit(ask(tokens=500), go_on))
    assert grant.tokens == 500
    gate.refused(grant, ModelThrottled("429", retry_after=10.0, limits=Limits(rpm=60)))
    [use] = local.use([MODEL])
    assert use.tokens_available is not None and use.tokens_available <= 0, use
    assert use.requests_available is not None and use.requests_available <= 0, use
    assert use.learned == Limits(rpm=60)
    after = gate.admit(ask(), go_on)
    assert isinstance(after, Throttle) and after.reason == "penalty", after
    assert after.seconds == pytest.approx(10.0)


# ------------------------------------------------------------------------ settings


def test_the_settings_default_and_read_what_is_set() -> None:
    assert AdmissionSettings.from_env({}) == AdmissionSettings()
    assert AdmissionSettings().max_retry_after == DEFAULT_MAX_RETRY_AFTER
    settings = AdmissionSettings.from_env(
        {
            "PARLEY_ADMISSION": " OFF ",
            "PARLEY_MODEL_LIMITS": "openai:gpt-4o-mini=500rpm/200000tpm, anthropic:claude=50rpm",
            "PARLEY_TENANT_WEIGHTS": "acme=3,globex=0.5",
            "PARLEY_MAX_RETRY_AFTER": "12.5",
        }
    )
    assert settings == AdmissionSettings(
        enabled=False,
        model_limits={
            "openai:gpt-4o-mini": Limits(rpm=500, tpm=200_000),
            "anthropic:claude": Limits(rpm=50),
        },
        tenant_weights={"acme": 3.0, "globex": 0.5},
        max_retry_after=12.5,
    )
    assert not CallAdmission(LocalAdmission(), settings, {}).enabled


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("PARLEY_MODEL_LIMITS", "openai:gpt-4o", "is not MODEL=LIMITS"),
        ("PARLEY_MODEL_LIMITS", "=500rpm", "is not MODEL=LIMITS"),
        ("PARLEY_MODEL_LIMITS", "m=500", "expected <N>rpm and/or <N>tpm"),
        ("PARLEY_MODEL_LIMITS", "m=0rpm", "expected <N>rpm and/or <N>tpm"),
        ("PARLEY_MODEL_LIMITS", "m=-5rpm", "expected <N>rpm and/or <N>tpm"),
        ("PARLEY_MODEL_LIMITS", "m=5rpm/6rpm", "expected <N>rpm and/or <N>tpm"),
        ("PARLEY_MODEL_LIMITS", "m=5rpm,m=6rpm", "names 'm' twice"),
        ("PARLEY_TENANT_WEIGHTS", "acme", "is not TENANT=WEIGHT"),
        ("PARLEY_TENANT_WEIGHTS", "acme=0", "positive weight"),
        ("PARLEY_TENANT_WEIGHTS", "acme=-1", "positive weight"),
        ("PARLEY_TENANT_WEIGHTS", "acme=heavy", "positive weight"),
        ("PARLEY_TENANT_WEIGHTS", "acme=nan", "positive weight"),
        ("PARLEY_TENANT_WEIGHTS", "acme=inf", "positive weight"),
        ("PARLEY_MAX_RETRY_AFTER", "0", "positive number of seconds"),
        ("PARLEY_MAX_RETRY_AFTER", "-5", "positive number of seconds"),
        ("PARLEY_MAX_RETRY_AFTER", "soon", "positive number of seconds"),
        ("PARLEY_MAX_RETRY_AFTER", "inf", "positive number of seconds"),
        ("PARLEY_MAX_RETRY_AFTER", "nan", "positive number of seconds"),
        ("PARLEY_ADMISSION", "maybe", "must be on or off"),
        ("PARLEY_ADMISSION", "true", "must be on or off"),
    ],
)
def test_the_settings_refuse_what_they_cannot_mean(name: str, value: str, says: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        AdmissionSettings.from_env({name: value})
    message = str(refused.value)
    assert name in message, message
    assert says in message, message

"""The Redis admission: :mod:`.admission_math`'s arithmetic fleet-wide, in one Lua script
(``lua/admission.lua``) that changes a model's state atomically on Redis's own clock.

Each model's keys (:func:`~parley.coordination.constants.admission_key` and its
companions) carry the model as their hash tag: one script call touches one slot.  An
``acquire``, a ``settle``, an ``observe``, a ``penalise`` and a ``learn`` each cost one
round trip (two when the server lost the script, which is then loaded again); ``use``
reads every model asked about in one pipeline and does the arithmetic here, changing
nothing.

A Redis out of reach: every method raises :class:`AdmissionUnreachable` (a
``redis.ConnectionError``), so that a caller can let the call go rather than fail a turn
because Redis blinked; any other Redis error is raised as redis-py raised it.

Flushed state: the next acquire finds full buckets (the bound in :mod:`.admission_math`).
Learned limits would be lost with it, so each admission keeps the latest it saw (from
``learn`` and from every grant) and sends them with each acquire; the script restores
them into a state that lacks them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, get_args

import redis

from parley.coordination import admission_checks as checks
from parley.coordination import admission_math as am
from parley.coordination import admission_views as views
from parley.coordination import constants as c
from parley.coordination.redis_clients import ClusterClient, open_client
from parley.coordination.redis_coordinator import COMMAND_SOCKET_SECONDS, MAX_CONNECTIONS
from parley.coordination.redis_scripts import ADMISSION
from parley.ports.admission import (
    Admission,
    Demand,
    Grant,
    Limits,
    ModelUse,
    ProviderReport,
    Reason,
)

_REASONS: dict[str, Reason] = {reason: reason for reason in get_args(Reason)}


class AdmissionUnreachable(redis.ConnectionError):
    """Redis did not answer an admission call (down, or too slow): the caller decides
    whether its model call goes ahead unadmitted."""


def _text(value: int | float | None) -> str:
    return "" if value is None else repr(value)


def _number(value: Any) -> float | None:
    if value is None or value in (b"", ""):
        return None
    return float(value.decode() if isinstance(value, bytes) else value)


def _whole(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


class RedisAdmission(Admission):
    """The admission port on Redis.  ``client``: a redis-py client (of a server or a
    cluster) to share (the
    coordinator's, ``RedisCoordinator.redis``), or a URL to open a pool of its own on
    (closed by :meth:`close`)."""

    def __init__(self, client: Any) -> None:
        self._owned = isinstance(client, str)
        # A URL: as the coordinator's command pool, a thread waits for a free connection
        # rather than fail, and a half-open connection cannot hold a call for long.
        self.client: Any = (
            open_client(
                client, max_connections=MAX_CONNECTIONS, socket_timeout=COMMAND_SOCKET_SECONDS
            )
            if isinstance(client, str)
            else client
        )
        self._script = self.client.register_script(ADMISSION)
        self._guard = threading.Lock()
        self._learned: dict[str, Limits] = {}  # the latest each model's state held

    def close(self) -> None:
        """Close the pool, if this admission opened it."""
        if self._owned:
            self.client.close()

    def acquire(self, demand: Demand, configured: Limits | None) -> Grant:
        checks.check_demand(demand)
        with self._guard:
            fallback = self._learned.get(demand.model)
        reply = self._run(
            demand.model,
            "acquire",
            demand.priority,
            demand.tokens,
            demand.tenant,
            _text(float(demand.weight)),
            _text(configured.rpm if configured else None),
            _text(configured.tpm if configured else None),
            _text(fallback.rpm if fallback else None),
            _text(fallback.tpm if fallback else None),
        )
        granted, wait, tokens, reason, rpm, tpm, requests_mark, tokens_mark = reply
        known = self._keep_learned(demand.model, _whole(rpm), _whole(tpm))
        answer = am.Answer(
            granted=bool(granted),
            wait=_number(wait) or 0.0,
            tokens=_whole(tokens) or 0,
            reason=_REASONS[reason.decode() if isinstance(reason, bytes) else reason],
            requests_mark=_number(requests_mark) or 0.0,
            tokens_mark=_number(tokens_mark) or 0.0,
        )
        return views.grant_of(demand, answer, known)

    def settle(self, grant: Grant, used_tokens: int) -> None:
        checks.check_used(used_tokens)
        if grant.granted and grant.tokens:
            self._run(grant.demand.model, "settle", grant.tokens, used_tokens)

    def observe(self, grant: Grant, report: ProviderReport) -> None:
        checks.check_report(report)
        if grant.granted:
            self._run(
                grant.demand.model,
                "observe",
                _text(grant.requests_mark),
                _text(grant.tokens_mark),
                _text(report.requests_remaining),
                _text(report.tokens_remaining),
            )

    def penalise(self, model: str, retry_after: float) -> None:
        checks.check_model(model)
        checks.check_seconds("retry_after", retry_after)
        self._run(model, "penalise", _text(float(retry_after)))

    def learn(self, model: str, reported: Limits) -> None:
        checks.check_model(model)
        self._run(model, "learn", _text(reported.rpm), _text(reported.tpm))
        with self._guard:
            before = self._learned.get(model) or Limits(rpm=reported.rpm, tpm=reported.tpm)
            self._learned[model] = Limits(
                rpm=before.rpm if reported.rpm is None else reported.rpm,
                tpm=before.tpm if reported.tpm is None else reported.tpm,
            )

    def models(self) -> list[str]:
        """The models Redis holds admission state for (an operator's question, asked by
        a scan: never on a call's path)."""
        pattern = c.admission_key("*")
        try:
            keys = list(self.client.scan_iter(match=pattern, count=1000))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise AdmissionUnreachable(f"admission could not read Redis: {exc}") from exc
        names = (k.decode() if isinstance(k, bytes) else k for k in keys)
        # Only the state hashes: their companions' names go on past the closing brace.
        return sorted(n[len("parley:adm:{") : -1] for n in names if n.endswith("}"))

    def use(self, models: Sequence[str]) -> list[ModelUse]:
        for model in models:
            checks.check_model(model)
        cluster = isinstance(self.client, ClusterClient)
        try:
            pipe = self.client.pipeline(transaction=False)
            if not cluster:
                pipe.time()  # (the one clock, in the same round trip)
            for model in models:
                self._queue_reads(pipe, model)
            replies = pipe.execute()
            if cluster:
                clocks = [self._clock_of(model) for model in models]
            else:
                clocks = [_seconds(replies.pop(0))] * len(models)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise AdmissionUnreachable(f"admission could not read Redis: {exc}") from exc
        return [
            views.model_use(model, _state(*replies[5 * i : 5 + 5 * i]), now)
            for i, (model, now) in enumerate(zip(models, clocks, strict=True))
        ]

    def _clock_of(self, model: str) -> float:
        """The time now by the clock of the model's state on a cluster: the ``TIME`` of
        the node that holds it, whose script keeps the state (a round trip: an operator's
        question)."""
        node = self.client.get_node_from_key(c.admission_key(model))
        return _seconds(self.client.time(target_nodes=node))

    def state(self, model: str) -> am.ModelState:
        """The model's state as its keys hold it now (for tests, and a curious operator)."""
        checks.check_model(model)
        pipe = self.client.pipeline(transaction=False)
        self._queue_reads(pipe, model)
        try:
            return _state(*pipe.execute())
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise AdmissionUnreachable(f"admission could not read Redis: {exc}") from exc

    @staticmethod
    def _queue_reads(pipe: Any, model: str) -> None:
        """Queue the reads of every key of the model's state (what ``_state`` parses)."""
        pipe.hgetall(c.admission_key(model))
        pipe.zrange(c.admission_tickets_key(model), 0, -1, withscores=True)
        pipe.hgetall(c.admission_weights_key(model))
        pipe.hgetall(c.admission_served_key(model))
        pipe.hgetall(c.admission_interactive_key(model))

    def _run(self, model: str, *args: Any) -> Any:
        """One call of the script on the model's keys (NOSCRIPT reloads it and calls
        again: redis-py's Script does)."""
        keys = [
            c.admission_key(model),
            c.admission_tickets_key(model),
            c.admission_weights_key(model),
            c.admission_served_key(model),
            c.admission_interactive_key(model),
        ]
        try:
            return self._script(keys=keys, args=[*args, c.ADMISSION_STATE_SECONDS])
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise AdmissionUnreachable(f"admission could not reach Redis: {exc}") from exc

    def _keep_learned(self, model: str, rpm: int | None, tpm: int | None) -> Limits | None:
        """Remember what the model's state holds as learned (to restore after a flush)."""
        if rpm is None and tpm is None:
            return None
        known = Limits(rpm=rpm, tpm=tpm)
        with self._guard:
            self._learned[model] = known
        return known


def _seconds(time: tuple[int, int]) -> float:
    """A ``TIME`` reply in seconds."""
    seconds, micros = time
    return seconds + micros / 1_000_000


def _state(
    fields: dict[Any, Any],
    tickets: list[Any],
    weights: dict[Any, Any],
    served: dict[Any, Any],
    interactive: dict[Any, Any],
) -> am.ModelState:
    """A model's state as its keys hold it (what the script's ``load`` reads)."""
    raw = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
    state = am.ModelState(
        r_level=_number(raw.get("r_level")),
        t_level=_number(raw.get("t_level")),
        at=_number(raw.get("at")),
        rpm=_whole(raw.get("rpm")),
        tpm=_whole(raw.get("tpm")),
        learned_rpm=_whole(raw.get("learned_rpm")),
        learned_tpm=_whole(raw.get("learned_tpm")),
        slow=_number(raw.get("slow")) or 1.0,
        slowed_at=_number(raw.get("slowed_at")) or 0.0,
        blocked_until=_number(raw.get("blocked_until")) or 0.0,
        interactive_until=_number(raw.get("interactive_until")) or 0.0,
        r_granted=_number(raw.get("r_granted")) or 0.0,
        t_granted=_number(raw.get("t_granted")) or 0.0,
        calls=_number(raw.get("calls")) or 0.0,
        refusals=_number(raw.get("refusals")) or 0.0,
        evidence_at=_number(raw.get("evidence_at")) or 0.0,
    )
    for tenant, clock in tickets:
        name = tenant.decode() if isinstance(tenant, bytes) else tenant
        state.tickets[name] = float(clock)
    for tenant, weight in weights.items():
        name = tenant.decode() if isinstance(tenant, bytes) else tenant
        state.weights[name] = _number(weight) or 1.0
    for tenant, service in served.items():
        name = tenant.decode() if isinstance(tenant, bytes) else tenant
        state.served[name] = _number(service) or 0.0
    for tenant, clock in interactive.items():
        name = tenant.decode() if isinstance(tenant, bytes) else tenant
        state.interactive_clocks[name] = _number(clock) or 0.0
    return state

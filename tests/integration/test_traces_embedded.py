"""Traces of the embedded runtime (docs/operations.md#traces), read by a real OTLP/HTTP
receiver on loopback: the caller's current context is the parent of a Python submission;
content only with ``PARLEY_TRACE_CONTENT=1``; a refused call and a wait for capacity have
their spans; the latency histograms' exemplars name the turn's trace; and without the
variables parley makes no provider, no exporter, no thread and no span."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

import parley
from parley import metrics_export
from parley.schemas import tables as t
from parley.telemetry import tracing
from tests.support.otlp import CONTENT_ATTRIBUTES, OtlpReceiver, ReceivedSpan, tree

REPO = Path(__file__).resolve().parents[2]


SCRIPT = {
    "rules": [
        {
            "when": "",
            "steps": [
                {
                    "text": "reading. ",
                    "tool_calls": [
                        {"name": "read_file", "arguments": {"path": "notes.txt"}},
                        {"name": "write_file", "arguments": {"path": "secret.txt", "content": "x"}},
                    ],
                },
                {"text": "the notes say hello"},
            ],
        }
    ]
}


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """A receiver this process exports to (decided anew before and after the test)."""
    with OtlpReceiver() as found:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", found.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.delenv("PARLEY_TRACE_CONTENT", raising=False)
        tracing.reset_for_tests()
        try:
            yield found
        finally:
            tracing.reset_for_tests()


def _client(tmp_path: Path, **host: object) -> tuple[parley.Client, parley.Session]:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "notes.txt").write_text("hello")
    made = parley.Host(
        model=parley.models.ScriptedModel(SCRIPT),
        policy=parley.Policy(deny_write=["secret.txt"]),
        **host,  # type: ignore[arg-type]
    )
    client = parley.connect(f"sqlite:///{tmp_path / 'runs.db'}", host=made)
    return client, client.open_session(root=str(root))


def _ended(receiver: OtlpReceiver) -> list[ReceivedSpan]:
    return receiver.wait_for(
        lambda spans: any(
            s.name == "invoke_agent parley" and s.attributes.get("parley.outcome") == "finished"
            for s in spans
        )
    )


def test_the_callers_current_span_is_the_parent_of_a_python_submission(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    client, session = _client(tmp_path)
    from opentelemetry import trace

    assert tracing.tracer() is not None
    with trace.get_tracer("the-caller").start_as_current_span("handle request") as caller:
        result = session.turn("read the notes")
    client.close()
    assert result.reply == "the notes say hello"  # (the last step's text)
    _ended(receiver)
    trace_id = format(caller.get_span_context().trace_id, "032x")
    spans = receiver.trace(trace_id)
    shown = tree(spans)
    submit = next(s for s in spans if s.name == "parley.submit")
    assert submit.parent_span_id == format(caller.get_span_context().span_id, "016x"), shown
    agent = next(s for s in spans if s.name == "invoke_agent parley")
    assert agent.parent_span_id == submit.span_id
    assert agent.resource["service.name"] == "parley"
    tools = {s.name: s.attributes for s in spans if s.name.startswith("execute_tool")}
    assert tools["execute_tool read_file"]["parley.tool.decision"] == "ran"
    assert tools["execute_tool write_file"]["parley.tool.decision"] == "refused"
    # No content without the opt-in.
    assert not CONTENT_ATTRIBUTES & {k for s in receiver.spans() for k in s.attributes}, shown


def test_content_is_in_spans_only_with_the_opt_in(
    receiver: OtlpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARLEY_TRACE_CONTENT", "1")
    tracing.reset_for_tests()
    client, session = _client(tmp_path)
    session.turn("read the notes")
    client.close()
    spans = _ended(receiver)
    first = next(s for s in spans if s.name == "chat scripted" and s.attributes["parley.step"] == 0)
    assert '"read the notes"' in str(first.attributes["gen_ai.input.messages"])
    assert '"reading. "' in str(first.attributes["gen_ai.output.messages"])
    read = next(s for s in spans if s.name == "execute_tool read_file")
    assert read.attributes["gen_ai.tool.call.result"] == "hello"
    assert read.attributes["gen_ai.tool.call.arguments"] == '{"path": "notes.txt"}'
    agent = next(s for s in spans if s.name == "invoke_agent parley")
    assert agent.attributes["parley.prompt"] == "read the notes"


def test_a_wait_for_capacity_is_a_span_of_the_turns_trace(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    # Thirty calls a minute: the second step's call waits some 2 s for capacity, which
    # it spends queued again, not in its slot; its next attempt's wait span says how long.
    client, session = _client(tmp_path, limits={"scripted": parley.Limits(rpm=30)})
    result = session.turn("read the notes", timeout=60)
    client.close()
    assert result.reply == "the notes say hello"  # (the last step's text)
    spans = _ended(receiver)
    shown = tree(spans)
    waits = [s for s in spans if s.name == "parley.wait capacity"]
    assert waits, shown
    assert all(s.trace_id == waits[0].trace_id for s in spans if "parley.turn.id" in s.attributes)
    assert max(s.end_ns - s.start_ns for s in waits) > 100_000_000, shown  # over 0.1 s


def _turn_in_a_fresh_process(tmp_path: Path, **env: str) -> str:
    """Run a turn in a new interpreter with ``env``; what it printed: the process's tracer
    provider, whether an exporting thread runs, and whether parley traces.  (Whether
    the SDK is imported is not parley's to say: redis-py imports it where installed.)"""
    program = f"""
import threading, parley
from opentelemetry import trace
from parley.telemetry import tracing
client = parley.connect("sqlite:///{tmp_path / "fresh.db"}", host=parley.Host(
    model=parley.models.ScriptedModel({{"rules": [{{"when": "", "steps": [{{"text": "hi"}}]}}]}})))
print(client.open_session(root="{tmp_path}").turn("hello").reply)
client.close()
exporting = any(t.name.startswith("OtelBatch") for t in threading.enumerate())
print(type(trace.get_tracer_provider()).__name__, exporting, tracing.tracer() is not None)
"""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", program],
        env={**clean, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_without_the_variables_parley_makes_no_provider_exporter_or_span(
    tmp_path: Path,
) -> None:
    with OtlpReceiver() as listening:
        printed = _turn_in_a_fresh_process(tmp_path)
        assert printed.splitlines() == ["hi", "ProxyTracerProvider False False"]
        # Disabled by the standard switch, an endpoint changes nothing either.
        printed = _turn_in_a_fresh_process(
            tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=listening.endpoint, OTEL_SDK_DISABLED="true"
        )
        assert printed.splitlines() == ["hi", "ProxyTracerProvider False False"]
        assert listening.requests == 0
        # The same process with the endpoint exports (the receiver works).
        printed = _turn_in_a_fresh_process(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=listening.endpoint)
        assert printed.splitlines() == ["hi", "TracerProvider True True"]
        assert any(s.name == "invoke_agent parley" for s in listening.spans())
        assert listening.requests >= 1


def _exemplars(exposition: str, metric: str) -> set[str]:
    """The trace ids of ``metric``'s bucket exemplars in an OpenMetrics exposition."""
    found = re.findall(
        rf'^{metric}_bucket{{.*}} \S+ # {{trace_id="([0-9a-f]{{32}})"}}', exposition, re.M
    )
    return set(found)


def test_the_latency_histograms_carry_a_turns_trace_as_their_exemplar(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    client, session = _client(tmp_path)
    result = session.turn("read the notes")
    client.close()
    agent = next(
        s
        for s in _ended(receiver)
        if s.name == "invoke_agent parley" and s.attributes["parley.turn.id"] == result.turn_id
    )
    body, content_type = metrics_export.exposition("application/openmetrics-text")
    assert content_type.startswith("application/openmetrics-text")
    text = body.decode()
    for metric in ("parley_turn_duration_seconds", "parley_queue_wait_seconds"):
        assert agent.trace_id in _exemplars(text, metric), metric
    # The plain text format has no exemplars (a scraper that did not ask is not sent any).
    assert "trace_id" not in metrics_export.exposition(None)[0].decode()


def test_a_worker_counting_in_files_serves_its_exemplars_too(tmp_path: Path) -> None:
    # A Celery worker's processes count in PROMETHEUS_MULTIPROC_DIR, where
    # prometheus_client keeps no exemplar: parley's own file per process carries them.
    counts = tmp_path / "counts"
    counts.mkdir()
    program = f"""
import parley
from parley import metrics_export
from opentelemetry import trace
client = parley.connect("sqlite:///{tmp_path / "files.db"}", host=parley.Host(
    model=parley.models.ScriptedModel({{"rules": [{{"when": "", "steps": [{{"text": "hi"}}]}}]}})))
client.open_session(root="{tmp_path}").turn("hello")
client.close()
print(metrics_export.exposition("application/openmetrics-text")[0].decode())
"""
    with OtlpReceiver() as listening:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        done = subprocess.run(
            [sys.executable, "-c", program],
            env={
                **clean,
                "PYTHONPATH": str(REPO),
                "PROMETHEUS_MULTIPROC_DIR": str(counts),
                "OTEL_EXPORTER_OTLP_ENDPOINT": listening.endpoint,
                "OTEL_BSP_SCHEDULE_DELAY": "50",
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        agent = listening.wait_for(
            lambda spans: any(s.name == "invoke_agent parley" for s in spans)
        )
    trace_id = next(s.trace_id for s in agent if s.name == "invoke_agent parley")
    assert list(counts.glob("exemplars_*.json")), "no exemplar file"
    assert _exemplars(done.stdout, "parley_turn_duration_seconds") == {trace_id}
    assert _exemplars(done.stdout, "parley_first_token_latency_seconds") == {trace_id}


def test_a_batch_line_is_a_trace_of_its_own_from_its_first_attempt(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    # A batch's lines are stored without a context (a batch of 100 000 lines is not one
    # trace): each line's first attempt starts its trace, and the run keeps it.
    client, _session = _client(tmp_path)
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"input": "hi"},
        }
        for i in range(2)
    ]
    batch = client.submit_batch(lines, root=str(tmp_path / "repo"))
    outputs = list(batch.results(timeout=60))
    assert len(outputs) == 2
    turns = [o["response"]["body"]["id"] for o in outputs]
    spans = receiver.wait_for(lambda got: sum(s.name == "invoke_agent parley" for s in got) == 2)
    client.close()
    by_turn = {s.attributes["parley.turn.id"]: s for s in spans if s.name == "invoke_agent parley"}
    assert set(by_turn) == set(turns)
    assert len({s.trace_id for s in by_turn.values()}) == 2  # a trace each
    for turn_id, agent in by_turn.items():
        assert agent.parent_span_id is None, tree(spans)  # the root of its trace
        assert agent.attributes["parley.priority"] == "batch"
        wait = next(
            s
            for s in spans
            if s.name == "parley.wait queue" and s.attributes["parley.turn.id"] == turn_id
        )
        assert wait.parent_span_id == agent.span_id
        stored = client.store.run_state(str(turn_id)).trace_context
        assert stored is not None
        assert stored["traceparent"].startswith(f"00-{agent.trace_id}-{agent.span_id}-")
    client.close()


def test_a_trace_context_that_cannot_be_kept_does_not_fail_the_turn(
    receiver: OtlpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from parley.schemas.errors import StoreError
    from parley.store.sql_store import SqlStore

    def refuse(_store: SqlStore, _run_id: str, _context: dict[str, str]) -> None:
        raise StoreError("database error: the disk is full")

    monkeypatch.setattr(SqlStore, "set_trace_context", refuse)
    client, _session = _client(tmp_path)
    line = {"custom_id": "a", "method": "POST", "url": "/v1/responses", "body": {"input": "hi"}}
    outputs = list(client.submit_batch([line], root=str(tmp_path / "repo")).results(timeout=60))
    client.close()
    assert outputs[0]["response"]["body"]["status"] == "completed"
    spans = receiver.wait_for(lambda got: any(s.name == "invoke_agent parley" for s in got))
    agent = next(s for s in spans if s.name == "invoke_agent parley")
    assert agent.attributes["parley.outcome"] == "finished"


def test_a_schedules_firing_is_a_span_its_turns_trace_starts_from(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    client, session = _client(tmp_path)
    schedule = client.schedule(
        "0 9 * * *", "read the notes", session_id=session.id, priority="interactive"
    )
    with client.store.engine.begin() as db:  # its slot has come
        db.execute(
            update(t.schedules)
            .where(t.schedules.c.id == schedule.id)
            .values(next_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    client.runtime.kicker.ready()  # (its recovery thread fires slots)
    spans = _ended(receiver)
    [run] = schedule.runs()
    client.close()
    fire = next(s for s in spans if s.name == "parley.schedule.fire")
    assert fire.kind == "PRODUCER"
    assert fire.attributes["parley.schedule.id"] == schedule.id
    assert fire.attributes["parley.schedule.fired"] == 1
    agent = next(s for s in spans if s.name == "invoke_agent parley")
    assert agent.trace_id == fire.trace_id, tree(spans)
    assert run.turn_id is not None and run.turn_id in str(fire.attributes["parley.turn.ids"])

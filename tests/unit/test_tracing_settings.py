"""When parley traces, as the standard variables say (docs/operations.md#traces), and the
names it gives a model call's provider and model."""

from __future__ import annotations

import json

import pytest

from parley.schemas.errors import InvalidRequest
from parley.settings import Settings
from parley.telemetry import tracing
from parley.telemetry.turn_spans import provider_and_model

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


def test_an_endpoint_turns_tracing_on() -> None:
    assert not tracing.configured({})
    assert tracing.configured(ENDPOINT)
    traces_endpoint = "http://127.0.0.1:4318/v1/traces"
    assert tracing.configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces_endpoint})
    assert not tracing.configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "  "})


def test_the_settings_hold_the_standard_variables() -> None:
    settings = Settings.from_environment({**ENDPOINT, "OTEL_BSP_SCHEDULE_DELAY": "50"})
    assert settings.telemetry == ENDPOINT
    assert tracing.configured(settings.telemetry)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OTEL_SDK_DISABLED", "true"),
        ("OTEL_SDK_DISABLED", "TRUE"),
        ("OTEL_TRACES_EXPORTER", "none"),
    ],
)
def test_the_standard_switches_turn_it_off(name: str, value: str) -> None:
    assert not tracing.configured({**ENDPOINT, name: value})


@pytest.mark.parametrize("value", ["yes", "true", "2", "on"])
def test_a_malformed_content_switch_is_refused(value: str) -> None:
    with pytest.raises(InvalidRequest, match="PARLEY_TRACE_CONTENT must be 1 or 0"):
        Settings.from_environment({"PARLEY_TRACE_CONTENT": value})


@pytest.mark.parametrize(
    ("value", "meant"), [("", False), ("0", False), ("1", True), (" 1 ", True)]
)
def test_a_content_switch_of_1_or_0_is_taken(value: str, meant: bool) -> None:
    assert Settings.from_environment({"PARLEY_TRACE_CONTENT": value}).trace_content is meant


def test_a_model_name_says_its_provider() -> None:
    assert provider_and_model("openai:gpt-4o-mini") == ("openai", "gpt-4o-mini")
    assert provider_and_model("anthropic:claude-x:beta") == ("anthropic", "claude-x:beta")
    assert provider_and_model("scripted") == ("parley", "scripted")


def test_off_every_span_is_nothing_and_no_context_is_stored() -> None:
    tracing.reset_for_tests()
    try:
        assert tracing.tracer() is None
        with tracing.span("anything") as span:
            assert span is None
        assert tracing.carrier() is None
        assert (
            tracing.context_of({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}) is None
        )
        assert tracing.trace_id() is None
    finally:
        tracing.reset_for_tests()


def test_a_calls_input_messages_keep_the_newest_that_fit() -> None:
    from parley.schemas.messages import UserMessage
    from parley.telemetry.turn_spans import INPUT_LIMIT, _input_messages

    messages = [UserMessage(text=f"{n}:" + "x" * 5_000) for n in range(40)]
    shown, left_out = _input_messages(messages)
    assert len(shown) <= INPUT_LIMIT and left_out > 0
    kept = json.loads(shown)
    assert len(kept) == 40 - left_out
    assert kept[-1]["parts"][0]["content"].startswith("39:")  # the newest are kept
    assert _input_messages(messages[:2])[1] == 0
    # One message over the whole budget is still shown (each text is cut anyway).
    assert json.loads(_input_messages([UserMessage(text="y" * 100_000)])[0])

"""model_from_spec: PARLEY_MODEL strings become models, configured from the environment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from parley.errors import InvalidRequest
from parley.models import (
    AnthropicModel,
    Fallover,
    OpenAIChatModel,
    ScriptedModel,
    model_from_spec,
)
from parley.ports.host import Model, ModelRequest
from parley.schemas.messages import Prefix, UserMessage
from tests.providers.servers import Reply, openai_server, openai_text
from tests.providers.sink import RecordingSink

SCRIPT = str(Path(__file__).resolve().parents[2] / "src" / "parley" / "demo" / "script.json")
OPENAI_KEY = "sk-env-openai-0123456789"
ANTHROPIC_KEY = "sk-env-anthropic-0123456789"
ENV = {"OPENAI_API_KEY": OPENAI_KEY, "ANTHROPIC_API_KEY": ANTHROPIC_KEY}


@pytest.fixture
def opened() -> Iterator[list[Model]]:
    models: list[Model] = []
    yield models
    for model in models:
        if isinstance(model, Fallover):
            model.close()


def test_an_openai_spec_is_a_retrying_openai_model(opened: list[Model]) -> None:
    model = model_from_spec("openai:gpt-4o-mini", ENV)
    opened.append(model)
    assert isinstance(model, Fallover)
    (inner,) = model.models
    assert isinstance(inner, OpenAIChatModel)
    assert (inner.name, inner.model) == ("openai:gpt-4o-mini", "gpt-4o-mini")
    assert inner.base_url.startswith("https://api.openai.com/v1")
    assert model.name == "openai:gpt-4o-mini"


def test_an_anthropic_spec_reads_its_base_url_from_the_environment(opened: list[Model]) -> None:
    model = model_from_spec(
        "anthropic:claude-sonnet-4-5", {**ENV, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
    )
    opened.append(model)
    assert isinstance(model, Fallover)
    (inner,) = model.models
    assert isinstance(inner, AnthropicModel)
    assert inner.name == "anthropic:claude-sonnet-4-5"
    assert inner.base_url.startswith("http://127.0.0.1:9")


def test_a_scripted_spec_is_the_scripted_model() -> None:
    assert isinstance(model_from_spec(f"scripted:{SCRIPT}", {}), ScriptedModel)


def test_a_list_is_an_ordered_fallover(opened: list[Model]) -> None:
    model = model_from_spec(f" openai:gpt-4o-mini , anthropic:claude-x, scripted:{SCRIPT}", ENV)
    opened.append(model)
    assert isinstance(model, Fallover)
    assert [m.name for m in model.models] == [
        "openai:gpt-4o-mini",
        "anthropic:claude-x",
        "scripted",
    ]


def test_only_the_given_environment_is_read(
    monkeypatch: pytest.MonkeyPatch, opened: list[Model]
) -> None:
    # The clients would read os.environ by themselves; the mapping passed in decides.
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/elsewhere")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-os-environ")
    with pytest.raises(InvalidRequest):
        model_from_spec("openai:gpt-4o-mini", {})
    model = model_from_spec("openai:gpt-4o-mini", ENV)
    opened.append(model)
    assert isinstance(model, Fallover)
    (inner,) = model.models
    assert isinstance(inner, OpenAIChatModel)
    assert "elsewhere" not in inner.base_url


@pytest.mark.parametrize(
    ("spec", "variable"),
    [("openai:gpt-4o-mini", "OPENAI_API_KEY"), ("anthropic:claude-x", "ANTHROPIC_API_KEY")],
)
def test_a_missing_key_is_a_clear_error(spec: str, variable: str) -> None:
    env = {k: v for k, v in ENV.items() if k != variable}
    with pytest.raises(InvalidRequest, match=variable):
        model_from_spec(spec, env)
    with pytest.raises(InvalidRequest, match=variable):
        model_from_spec(spec, {**env, variable: "   "})


@pytest.mark.parametrize(
    "spec",
    ["", " ", "openai:", "gpt-4o", "bogus:model", "openai:gpt-4o,,anthropic:claude-x", ","],
)
def test_malformed_specs_are_refused(spec: str) -> None:
    with pytest.raises(InvalidRequest):
        model_from_spec(spec, ENV)


def test_keys_are_not_shown(opened: list[Model]) -> None:
    model = model_from_spec("openai:gpt-4o-mini,anthropic:claude-x", ENV)
    opened.append(model)
    assert isinstance(model, Fallover)
    shown = repr(model) + str(model) + " ".join(repr(m) for m in model.models)
    assert OPENAI_KEY not in shown and ANTHROPIC_KEY not in shown


def test_a_selected_model_streams_from_the_configured_server(opened: list[Model]) -> None:
    with openai_server() as server:
        server.plan(Reply(frames=openai_text("hello ", "there")))
        model = model_from_spec("openai:gpt-test", {**ENV, "OPENAI_BASE_URL": server.base_url})
        opened.append(model)
        request = ModelRequest(
            prefix=Prefix(system_prompt="s", tools=()), messages=(UserMessage(text="hi"),)
        )
        sink = RecordingSink()
        reply = model.stream(request, sink)
        assert (reply.text, reply.model) == ("hello there", "openai:gpt-test")
        assert sink.deltas == ["hello ", "there"]
        assert server.received[0].headers["authorization"] == f"Bearer {OPENAI_KEY}"

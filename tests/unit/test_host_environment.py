"""Where a host comes from: ``PARLEY_HOST`` first, else a default host around the model
``PARLEY_MODEL`` names, else none (a client that only reads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import parley
from parley.errors import InvalidRequest
from parley.host import host_from_environment, model_from_environment


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"rules": [{"when": ".*", "steps": [{"text": "hi"}]}]}))
    return path


def test_parley_host_wins(script: Path) -> None:
    host = host_from_environment({"PARLEY_HOST": f"scripted:{script}", "PARLEY_MODEL": "x:y"})
    assert isinstance(host, parley.Host)
    assert isinstance(host.model, parley.models.ScriptedModel)


def test_parley_model_makes_a_default_host(script: Path) -> None:
    host = host_from_environment({"PARLEY_MODEL": f"scripted:{script}"})
    assert isinstance(host, parley.Host)
    assert host.tools == parley.tools.WORKSPACE_TOOLS


def test_a_network_model_takes_its_key_from_the_environment_only() -> None:
    env = {"PARLEY_MODEL": "openai:gpt-test", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    with pytest.raises(InvalidRequest, match="OPENAI_API_KEY"):
        model_from_environment(env)
    model = model_from_environment({**env, "OPENAI_API_KEY": "sk-secret-123456"})
    assert model.name == "openai:gpt-test"
    assert "sk-secret" not in repr(model)


def test_without_either_there_is_no_host() -> None:
    assert host_from_environment({}) is None


def test_a_host_without_a_model_needs_parley_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARLEY_MODEL", raising=False)
    with pytest.raises(InvalidRequest, match="PARLEY_MODEL"):
        parley.Host()


def test_a_reading_client_does_not_need_the_model_it_would_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PARLEY_MODEL without its key: reading works; the first turn says what is missing,
    before anything is written."""
    monkeypatch.setenv("PARLEY_MODEL", "openai:gpt-test")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("PARLEY_HOST", raising=False)
    with parley.connect(f"sqlite:///{tmp_path / 'db.sqlite'}") as client:
        session = client.open_session(str(tmp_path))
        assert session.history() == []
        with pytest.raises(InvalidRequest, match="OPENAI_API_KEY"):
            session.submit("hello")
        assert session.tree() == []

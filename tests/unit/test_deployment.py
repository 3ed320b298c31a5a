"""One decision of embedded or fleet, for ``parley.connect`` and the command line alike."""

from __future__ import annotations

import pytest

from parley.deployment import fleet_redis_url, is_fleet
from parley.errors import InvalidRequest

REDIS = "redis://127.0.0.1:6379/7"


def test_sqlite_is_embedded_whatever_the_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PARLEY_REDIS_URL", REDIS)
    assert fleet_redis_url("sqlite") is None
    assert not is_fleet("sqlite:///:memory:")
    with pytest.raises(InvalidRequest, match="needs PostgreSQL"):
        fleet_redis_url("sqlite", REDIS)


def test_another_database_is_a_fleet_with_a_redis_url_given_or_exported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PARLEY_REDIS_URL", raising=False)
    assert fleet_redis_url("postgresql") is None
    assert fleet_redis_url("postgresql", REDIS) == REDIS
    monkeypatch.setenv("PARLEY_REDIS_URL", "")
    assert fleet_redis_url("postgresql") is None
    monkeypatch.setenv("PARLEY_REDIS_URL", REDIS)
    assert fleet_redis_url("postgresql") == REDIS
    assert fleet_redis_url("postgresql", "redis://elsewhere:6379/0") == "redis://elsewhere:6379/0"

"""One decision of embedded or fleet, for ``parley.connect`` and the command line alike."""

from __future__ import annotations

import pytest

from parley.deployment import fleet_redis_url, is_fleet
from parley.errors import InvalidRequest
from parley.settings import Settings

REDIS = "redis://127.0.0.1:6379/7"


def test_sqlite_is_embedded_whatever_the_environment_says() -> None:
    exported = Settings.from_environment({"PARLEY_REDIS_URL": REDIS})
    assert fleet_redis_url("sqlite", None, exported) is None
    assert not is_fleet("sqlite:///:memory:", exported)
    with pytest.raises(InvalidRequest, match="needs PostgreSQL"):
        fleet_redis_url("sqlite", REDIS, exported)


def test_another_database_is_a_fleet_with_a_redis_url_given_or_exported() -> None:
    unset = Settings.from_environment({})
    assert fleet_redis_url("postgresql", None, unset) is None
    assert fleet_redis_url("postgresql", REDIS, unset) == REDIS
    empty = Settings.from_environment({"PARLEY_REDIS_URL": ""})
    assert fleet_redis_url("postgresql", None, empty) is None
    exported = Settings.from_environment({"PARLEY_REDIS_URL": REDIS})
    assert fleet_redis_url("postgresql", None, exported) == REDIS
    elsewhere = "redis://elsewhere:6379/0"
    assert fleet_redis_url("postgresql", elsewhere, exported) == elsewhere

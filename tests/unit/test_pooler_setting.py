"""``PARLEY_DATABASE_POOLER`` (docs/scaling.md#pgbouncer): what it takes, and a clear
refusal of anything else."""

from __future__ import annotations

import pytest

import parley
from parley.schemas.errors import InvalidRequest
from parley.settings import Settings


@pytest.mark.parametrize(
    ("value", "meant"),
    [("", None), ("pgbouncer", "pgbouncer"), (" PgBouncer ", "pgbouncer"), ("none", "none")],
)
def test_the_setting_names_a_pooler_none_or_detection(value: str, meant: str | None) -> None:
    assert Settings.from_environment({"PARLEY_DATABASE_POOLER": value}).database_pooler == meant
    assert Settings.from_environment({}).database_pooler is None


@pytest.mark.parametrize("value", ["pgpool", "yes", "1", "transaction"])
def test_anything_else_is_refused_naming_the_choices(value: str) -> None:
    with pytest.raises(InvalidRequest, match="PARLEY_DATABASE_POOLER must be pgbouncer or none"):
        Settings.from_environment({"PARLEY_DATABASE_POOLER": value})


def test_a_client_is_not_made_with_a_malformed_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_DATABASE_POOLER", "pgpool")
    with pytest.raises(InvalidRequest, match="PARLEY_DATABASE_POOLER"):
        parley.connect("postgresql+psycopg://postgres@127.0.0.1:1/nothing")

"""``PARLEY_DATABASE_POOLER`` (docs/scaling.md#pgbouncer): what it takes, and a clear
refusal of anything else."""

from __future__ import annotations

import pytest

from schemas.errors import InvalidRequest
from workers.store.database import create_database_engine, pooler_setting


@pytest.mark.parametrize(
    ("value", "meant"),
    [("", None), ("pgbouncer", "pgbouncer"), (" PgBouncer ", "pgbouncer"), ("none", "none")],
)
def test_the_setting_names_a_pooler_none_or_detection(value: str, meant: str | None) -> None:
    assert pooler_setting({"PARLEY_DATABASE_POOLER": value}) == meant
    assert pooler_setting({}) is None


@pytest.mark.parametrize("value", ["pgpool", "yes", "1", "transaction"])
def test_anything_else_is_refused_naming_the_choices(value: str) -> None:
    with pytest.raises(
        InvalidRequest, match="PARLEY_DATABASE_POOLER must be one of pgbouncer, none"
    ):
        pooler_setting({"PARLEY_DATABASE_POOLER": value})


def test_an_engine_is_not_made_with_a_malformed_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_DATABASE_POOLER", "pgpool")
    with pytest.raises(InvalidRequest, match="PARLEY_DATABASE_POOLER"):
        create_database_engine("postgresql+psycopg://postgres@127.0.0.1:1/nothing")

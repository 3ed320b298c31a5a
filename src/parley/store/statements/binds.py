"""How the catalogue's statements take their values: bind names, and inserts of many rows.

Bind names carry a ``b_`` prefix: SQLAlchemy reserves column names for the SET and VALUES
clauses.  An insert of up to :data:`MAX_INSERT_ROWS` rows runs as one multi-row statement
(:func:`many_rows`), whose binds are named per row (:func:`row_key`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Insert, bindparam

MAX_INSERT_ROWS = 32
"""Inserts of up to this many rows run as one multi-row statement (compiled per count)."""


def b(name: str, **kwargs: Any) -> Any:
    """A bind parameter named ``b_<name>``."""
    return bindparam(f"b_{name}", **kwargs)


def row_key(row: int, key: str) -> str:
    """The bind name of ``key`` in row ``row`` of a multi-row insert."""
    return f"r{row}_{key}"


def many_rows(
    statement: Insert, keys: Sequence[str], rows: int, shared: Mapping[str, Any] | None = None
) -> Insert:
    """``statement`` inserting ``rows`` rows of the columns ``keys``, whose binds are
    named by :func:`row_key`, plus ``shared`` values common to every row.  Each bind is
    typed with its column: SQLAlchemy types only the first row's."""
    columns = statement.table.c
    return statement.values(
        [
            {
                **{k: bindparam(row_key(i, k), type_=columns[k].type) for k in keys},
                **(shared or {}),
            }
            for i in range(rows)
        ]
    )

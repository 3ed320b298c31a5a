"""The one MetaData every table joins (its naming convention names constraints and indexes
the same on every database, as the migrations spell them), and the column types they share.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    DateTime,
    MetaData,
    String,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# JSONB on PostgreSQL (compact, indexable); JSON text elsewhere.
Json = JSON().with_variant(JSONB(), "postgresql")
Id = String(36)
Timestamp = DateTime(timezone=True)

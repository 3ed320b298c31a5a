"""Alembic migrations for parley's schema (run with ``parley migrate``)."""

"""parley's durable state on SQLite and PostgreSQL: one transaction per method, every SQL
statement built once and named in :mod:`parley.store.statements`, rows into records,
migrations and engines."""

"""Alembic environment: migrates the connection handed over by ``workers.migrate``, or the
URL in ``sqlalchemy.url`` when Alembic's own command line is used."""

from alembic import context
from sqlalchemy import create_engine

from parley.schemas.tables import metadata

config = context.config


def run_migrations() -> None:
    """Run every pending migration in one transaction per migration."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as owned:
        _run(owned)
    engine.dispose()


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()

"""Alembic environment for the Parallax database.

Two callers: ``db.connection.upgrade_to_head`` hands over an open connection in
``config.attributes["connection"]``; the ``alembic -c db/alembic.ini ...`` CLI gets none and
connects to ``contract.environment.database_url()`` (``PARALLAX_DB_URL`` or the SQLite file in
``PARALLAX_HOME``), or to ``sqlalchemy.url`` when that is set in the config.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, create_engine, func, make_url, pool, select

from db.connection import MIGRATION_LOCK_KEY, sqlite_file
from db.tables import Base
from contract.environment import database_url

config = context.config
target_metadata = Base.metadata

# Only the CLI configures logging; inside the application the app owns logging.
if config.config_file_name is not None and "connection" not in config.attributes:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    return database_url(config.get_main_option("sqlalchemy.url") or None)


def _configure_and_run(**options: object) -> None:
    # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
    context.configure(target_metadata=target_metadata, render_as_batch=True, **options)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Write the SQL to stdout (``alembic upgrade head --sql``) instead of running it."""
    _configure_and_run(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})


def run_migrations_online() -> None:
    connection: Connection | None = config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection=connection)
        return
    url = make_url(_url())
    path = sqlite_file(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    # A plain engine on purpose: SQLite leaves foreign keys off on it, so a batch rebuild
    # of ``runs`` (drop + rename) cannot cascade-delete the metrics of every run.
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            if connection.dialect.name == "postgresql":
                # The lock the application migrates under: never two migrations at once.
                connection.execute(select(func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))
            _configure_and_run(connection=connection)
            connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

"""Where a search's Optuna study lives: Optuna's RDB storage on Parallax's own database (SQLite or PostgreSQL), so
that a study outlives the dashboard and its driver, and ``parallax search --resume`` finds it where it was.

    storage = study_storage(url)                            # Optuna's tables made on first use
    study = optuna.load_study(study_name=name, storage=storage)
    read_only = study_storage(url, create=False)           # None while no search has made Optuna's tables

Optuna keeps its schema's version in ``version_info`` and would keep its migrations' in Alembic's
``alembic_version``, the table that holds Parallax's own revision here: its storage is opened without its own
compatibility check (which would read Parallax's revision as Optuna's), and ``version_info`` is checked here
instead. Optuna is imported only by the processes that use a study (a search's driver, the Search page).
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import inspect, text

from db.connection import busy_timeout_ms, make_engine, masked_url

_storages: dict[tuple[str, bool], Any] = {}
_lock = threading.Lock()


class StudySchemaMismatch(ValueError):
    """The database's Optuna tables were made by an Optuna whose schema differs from the one installed."""


def has_study_tables(url: str) -> bool:
    """Whether Optuna's tables exist in the database (made by the first search's driver)."""
    engine = make_engine(url)
    with engine.connect() as connection:
        return inspect(connection).has_table("studies") and inspect(connection).has_table("version_info")


def study_storage(url: str, *, create: bool = True):
    """Optuna's ``RDBStorage`` on the Parallax database ``url`` (migrated first, so that Alembic's table holds
    Parallax's revision before Optuna looks at it), cached per URL in this process; with ``create=False`` None
    where Optuna's tables are not there yet."""
    engine = make_engine(url)  # migrates: Optuna then finds alembic_version filled and leaves it alone
    key = (engine.url.render_as_string(hide_password=False), create)
    with _lock:
        if key in _storages:
            return _storages[key]
        if not create and not has_study_tables(url):
            return None
        import optuna

        options: dict[str, Any] = {}
        if engine.dialect.name == "sqlite":
            # One writer (the driver) and readers (the dashboard): wait out a lock, as Parallax's own connections do.
            options = {"connect_args": {"timeout": busy_timeout_ms() / 1000}}
        elif engine.dialect.name == "postgresql":
            options = {"pool_pre_ping": True}
        storage = optuna.storages.RDBStorage(key[0], engine_kwargs=options, skip_compatibility_check=True,
                                             skip_table_creation=not create)
        _check_schema(engine, storage)
        _storages[key] = storage
        return storage


def _check_schema(engine, storage) -> None:
    """Optuna's schema in the database against the installed Optuna's: a study written by another schema is
    refused in one line rather than read wrongly."""
    try:
        from optuna.storages._rdb.models import SCHEMA_VERSION  # where Optuna keeps it; absent, nothing to check
    except ImportError:
        return
    with engine.connect() as connection:
        found = connection.execute(text("SELECT schema_version, library_version FROM version_info")).first()
    if found is not None and int(found[0]) != SCHEMA_VERSION:
        import optuna

        raise StudySchemaMismatch(
            f"the searches in {masked_url(engine.url)} were stored by Optuna {found[1]} (study schema {found[0]}); "
            f"the installed Optuna {optuna.__version__} uses schema {SCHEMA_VERSION}: install Optuna {found[1]}, or "
            "upgrade the tables with `optuna storage upgrade` first")


def forget_storages() -> None:
    """Close every cached storage's connections (tests use this between databases)."""
    with _lock:
        for storage in _storages.values():
            storage.engine.dispose()
        _storages.clear()

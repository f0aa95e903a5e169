"""Open the database or say in one line why it cannot be used.

    engine = open_database(url)     # DatabaseUnavailable("cannot open the database sqlite:///...: ...")

The CLI and the dashboard call this first, so a mistyped URL, a server that does not answer or a
SQLite file in a read-only folder is reported as one sentence naming the database, never as a
SQLAlchemy traceback.
"""

from __future__ import annotations

import os

from sqlalchemy import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from db.connection import DatabaseUnavailable, make_engine, masked_url, sqlite_file
from contract.environment import database_url

__all__ = ["DatabaseUnavailable", "describe_failure", "open_database"]

HINT = "check that it exists, is reachable and writable, or give another with --db or PARALLAX_DB_URL"
HINT_OPENED = "what was recorded before stays; check that it is still reachable, writable and has room"


def describe_failure(url: str, exc: BaseException, *, opened: bool = False) -> str:
    """One line: which database, what went wrong, and what to do. ``opened``: the database opened
    and a later command failed (a value it refused, a server that went away, a disk that filled),
    which is not worded as a failure to open it."""
    if isinstance(exc, ArgumentError):
        return (f"database URL {url!r} is not a SQLAlchemy URL: use e.g. sqlite:////path/to/parallax.db "
                "or postgresql+psycopg://user@host/dbname")
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        reason = str(exc.orig)
    elif isinstance(exc, OSError) and exc.strerror:
        reason = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    else:
        reason = str(exc) or type(exc).__name__
    reason = " ".join(reason.split())  # drivers spread one reason over several lines
    try:
        path = sqlite_file(make_url(url))
    except ArgumentError:
        path = None
    if path is not None:
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not os.access(folder, os.W_OK):
            reason += f" (the folder {folder} is read-only)"
    if opened:
        return f"the database {masked_url(url)} failed a command after it opened: {reason}; {HINT_OPENED}"
    return f"cannot open the database {masked_url(url)}: {reason}; {HINT}"


def open_database(url: str | None = None) -> Engine:
    """``make_engine(url)``; any failure becomes ``DatabaseUnavailable`` with a one-line message."""
    resolved = database_url(url)
    try:
        return make_engine(resolved)
    except DatabaseUnavailable as exc:
        if exc.__cause__ is None:  # a URL that is not one: its message says all
            raise
        raise DatabaseUnavailable(describe_failure(resolved, exc.__cause__)) from None
    except (SQLAlchemyError, OSError) as exc:
        raise DatabaseUnavailable(describe_failure(resolved, exc)) from None

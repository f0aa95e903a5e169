"""Open the Parallax database: one SQLAlchemy engine per URL per process, migrated, with one session scope.

    engine = make_engine()                 # PARALLAX_DB_URL, or SQLite in PARALLAX_HOME
    with session_scope(engine) as session:
        session.execute(...)               # committed on exit, rolled back on error

``make_engine`` brings the schema to the newest Alembic revision before returning, so the
dashboard and every supervisor process can just call it. Opening an up-to-date database costs
one read of ``alembic_version``. Two backends are supported: SQLite (one machine) and
PostgreSQL through psycopg 3 (``postgresql+psycopg://user:password@host/db``, shared by
several machines). A URL that cannot be used raises ``DatabaseUnavailable`` with one line
naming it, password masked.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import URL, Connection, Engine, create_engine, event, func, inspect, make_url, select, text
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import Session

from contract.environment import database_url, seconds_from_env

if TYPE_CHECKING:  # imported only where a database is migrated (see schema_head)
    from alembic.config import Config
    from alembic.script import ScriptDirectory

try:
    import fcntl
except ImportError:  # Windows has no flock; first opens and migrations there are not serialised.
    fcntl = None  # type: ignore[assignment]

MIGRATIONS_DIR = Path(__file__).with_name("migrations")

# busy_timeout (set per connection, see busy_timeout_ms): a writer waits for another writer
# instead of failing at once. WAL lets the dashboard read while a supervisor writes;
# synchronous=NORMAL is safe under WAL (a power cut can lose the last commits, never corrupt
# the file) and much faster than FULL. SQLite enforces foreign keys (and so ON DELETE CASCADE)
# only when asked, per connection.
SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
)
LOCK_WAIT_ENV = "PARALLAX_DB_LOCK_WAIT_S"
DEFAULT_LOCK_WAIT_S = 300.0
MAX_BUSY_TIMEOUT_S = 30.0
SKIPPABLE_WRITE_WAIT_S = 1.0  # heartbeats and progress: skipped rather than stalling training

# PostgreSQL: check a pooled connection before use (the server restarted, or a firewall dropped
# an idle connection) and renew connections after half an hour; give up connecting after 10 s
# rather than hanging on an unreachable host.
POSTGRESQL_ENGINE_OPTIONS = {"pool_pre_ping": True, "pool_recycle": 1800}
POSTGRESQL_CONNECT_ARGS = {"connect_timeout": 10, "application_name": "parallax"}
# Key of the PostgreSQL advisory lock that serialises first-time migrations of one database.
MIGRATION_LOCK_KEY = 0x70617261_6C6C6178  # "parallax"

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


class DatabaseUnavailable(ValueError):
    """The database URL cannot be used: not a URL, no driver for it, or the server cannot be reached."""


def make_engine(url: str | None = None) -> Engine:
    """The engine for ``url`` (resolved by ``contract.environment.database_url``), migrated to the head.

    Cached per URL: calling it again in the same process returns the same engine.
    Raises ``DatabaseUnavailable`` when the database cannot be opened.
    """
    resolved = database_url(url)
    with _engines_lock:
        engine = _engines.get(resolved)
        if engine is None:
            engine = _create_engine(_parse_url(resolved))
            try:
                upgrade_to_head(engine)
            except DBAPIError as exc:  # unreachable, refused, no such database, no permission
                engine.dispose()
                raise DatabaseUnavailable(
                    f"cannot open the database {masked_url(engine.url)}: {_first_line(exc.orig or exc)}"
                ) from exc
            except BaseException:
                engine.dispose()
                raise
            _engines[resolved] = engine
        return engine


def masked_url(url: URL | str) -> str:
    """``url`` as text with its password replaced by ***, fit for messages and the dashboard."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", str(url))


def dispose_engines(*, forget: bool = True) -> None:
    """Close the pooled connections of every cached engine and forget the engines (tests use this
    between databases). ``forget=False`` keeps them, to connect again when next used: before a fork
    that outlives the moment (supervisor.rank_server), so that the child holds no open database. SQLite
    keeps what a process has locked per process, and a forked copy of that record would let the
    child's own connections believe they hold locks they do not."""
    with _engines_lock:
        for engine in _engines.values():
            engine.dispose()
        if forget:
            _engines.clear()


@contextlib.contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session that commits on success, rolls back on any error, and always closes."""
    # Values read inside the scope stay readable after the commit without another query.
    session = Session(engine, expire_on_commit=False)
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def sqlite_file(url: URL) -> Path | None:
    """The database file of a file-backed SQLite URL; None for in-memory or other backends."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def absolute_database_url(text: str) -> str:
    """``text`` with a relative SQLite file made absolute against this process's working directory,
    for a URL handed to another process (a launched supervisor) that runs elsewhere; others unchanged."""
    try:
        url = make_url(text)
    except ArgumentError:
        return text  # make_engine refuses it with its own message
    path = sqlite_file(url)
    if path is None or path.is_absolute():
        return text
    return url.set(database=os.path.abspath(path)).render_as_string(hide_password=False)


def _parse_url(text: str) -> URL:
    try:
        url = make_url(text)
    except ArgumentError:
        raise DatabaseUnavailable(
            f"database URL {masked_url(text)!r} is not a database URL; use sqlite:///path/to/parallax.db "
            "or postgresql+psycopg://user:password@host/database"
        ) from None
    if is_in_memory_sqlite(url):
        raise DatabaseUnavailable(
            f"database URL {text} is an in-memory SQLite database, which lives inside one connection: "
            "the schema, the run's processes and the dashboard would each see an empty one of their own; give a "
            "file, e.g. sqlite:////path/to/parallax.db"
        )
    return url


def is_in_memory_sqlite(url: URL) -> bool:
    """``sqlite://``, ``sqlite:///:memory:`` and ``file:…?mode=memory`` URIs."""
    if url.get_backend_name() != "sqlite":
        return False
    database = url.database or ""
    return database in ("", ":memory:") or (database.startswith("file:") and "mode=memory" in database) or \
        url.query.get("mode") == "memory"


def _create_engine(url: URL) -> Engine:
    path = sqlite_file(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {}
    if url.get_backend_name() == "postgresql":
        # Options given in the URL (?connect_timeout=3) win over these defaults.
        connect_args = {k: v for k, v in POSTGRESQL_CONNECT_ARGS.items() if k not in url.query}
        options = {**POSTGRESQL_ENGINE_OPTIONS, "connect_args": connect_args}
    try:
        engine = create_engine(url, **options)
    except (NoSuchModuleError, ImportError) as exc:
        raise DatabaseUnavailable(
            f"database URL {masked_url(url)} needs a driver that is not installed ({_first_line(exc)}); "
            "supported: sqlite:///path/to/parallax.db and postgresql+psycopg://user:password@host/database (its driver: "
            "pip install 'parallax-train[postgres]')"
        ) from None
    if url.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _set_sqlite_pragmas)
    return engine


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _set_sqlite_pragmas(dbapi_connection: Any, connection_record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms()}")
        for pragma in SQLITE_PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


# --- a database locked by another process ---------------------------------------------------


class DatabaseLockedError(RuntimeError):
    """A write kept finding the database locked by another process for the whole retry window."""


class DatabaseFullError(DatabaseLockedError):
    """A write found no space left for the database (SQLite's "database or disk is full", PostgreSQL's
    disk_full). A kind of DatabaseLockedError on purpose: every writer that gives up on a locked
    database (step points skipped, samples noted missing, the run failed with the reason) gives up
    on a full one the same way, and a retry cannot help either."""


class DatabaseReadOnlyError(DatabaseLockedError):
    """A write found the database read-only (its file system remounted read-only, its file's
    permissions changed, a PostgreSQL server in read-only mode): waiting does not help either."""


def read_only_reason(exc: BaseException) -> str | None:
    """Why ``exc`` means the database cannot be written any more, in the driver's words; else None."""
    if not isinstance(exc, DBAPIError):
        return None
    orig = exc.orig if exc.orig is not None else exc
    text = " ".join(str(orig).split())
    code = getattr(orig, "sqlite_errorcode", None)
    if (code is not None and code & 0xFF == 8) or "readonly database" in text:  # SQLITE_READONLY and its kinds
        return text[:200]
    if getattr(orig, "sqlstate", None) == "25006":  # PostgreSQL's read_only_sql_transaction
        return text[:200]
    return None


def full_reason(exc: BaseException) -> str | None:
    """Why ``exc`` means the database's disk is full, in the driver's words; None if it does not."""
    if not isinstance(exc, DBAPIError):
        return None
    orig = exc.orig if exc.orig is not None else exc
    text = str(orig)
    if (getattr(orig, "sqlite_errorcode", None) or 0) & 0xFF == 13 or "database or disk is full" in text:  # SQLITE_FULL
        return "database or disk is full"
    if getattr(orig, "sqlstate", None) == "53100" or "No space left on device" in text:  # PostgreSQL's disk_full
        return " ".join(text.split())[:200]
    return None


def _only_url() -> URL | None:
    """The URL of the one database this process records into (a run's processes use one), else None."""
    with _engines_lock:
        urls = {engine.url for engine in _engines.values()}
    return next(iter(urls)) if len(urls) == 1 else None


def _the_database() -> str:
    url = _only_url()
    return f" {masked_url(url)}" if url is not None else ""


def database_full_error(what: str, reason: str) -> DatabaseFullError:
    """The one line for a write that found the database's disk full, naming the database and its folder."""
    place, url = _the_database(), _only_url()
    if url is not None:
        path = sqlite_file(url)
        if path is not None:
            with contextlib.suppress(OSError):
                reason += f"; {shutil.disk_usage(path.parent).free // 1024} KiB left in {path.parent}"
    return DatabaseFullError(f"disk full while writing to the database{place}: could not {what} ({reason}): the "
                             "metrics recorded so far are kept; free some space (or use a database with room) and "
                             "run again")


def lock_wait_s() -> float:
    """How long a write that must not be lost (an epoch's metrics, how a run ended) keeps trying
    while another process holds the database's write lock: ``PARALLAX_DB_LOCK_WAIT_S``, default 300."""
    return seconds_from_env(LOCK_WAIT_ENV, DEFAULT_LOCK_WAIT_S)


def busy_timeout_ms() -> int:
    """SQLite's own wait for a lock, per statement: 30 s, or a fifth of the retry window if that
    is shorter, so a write is tried several times (with backoff) within the window."""
    return int(min(MAX_BUSY_TIMEOUT_S, lock_wait_s() / 5) * 1000)


def is_locked_error(exc: BaseException) -> bool:
    """True for SQLite's "database is locked" / "database is busy" (another process holds the lock)."""
    if not isinstance(exc, OperationalError):
        return False
    text = str(exc.orig if exc.orig is not None else exc).lower()
    return "locked" in text or "busy" in text


def retry_when_locked(action, *, what: str, window_s: float | None = None):
    """``action()``, tried again with backoff while the database is locked, for up to ``window_s``
    (default ``lock_wait_s()``); then DatabaseLockedError saying what could not be written."""
    window = lock_wait_s() if window_s is None else window_s
    deadline = time.monotonic() + window
    delay_s = 0.25
    while True:
        try:
            return action()
        except DBAPIError as exc:
            reason = full_reason(exc)
            if reason is not None:  # waiting does not make room
                raise database_full_error(what, reason) from exc
            reason = read_only_reason(exc)
            if reason is not None:
                raise DatabaseReadOnlyError(
                    f"the database{_the_database()} became read-only: could not {what} ({reason}): the metrics "
                    "recorded so far are kept; make it writable again (then `list` marks the run lost) and run again"
                ) from exc
            remaining = deadline - time.monotonic()
            if not is_locked_error(exc):
                raise
            if remaining <= 0:
                raise DatabaseLockedError(
                    f"could not {what}: the database stayed locked by another process for {window:g} s "
                    f"({LOCK_WAIT_ENV} sets how long to wait)"
                ) from exc
            time.sleep(min(delay_s, remaining))
            delay_s = min(delay_s * 2, 5.0)


def try_write(engine: Engine, statement) -> bool:
    """Execute one write that may be skipped (a heartbeat, a progress update: a newer one follows
    within seconds): it waits at most about a second for a lock. False if it was skipped, or if it
    matched no row (the run it stamps has ended)."""
    with engine.connect() as connection, lock_wait_at_most(connection, SKIPPABLE_WRITE_WAIT_S):
        try:
            matched = connection.execute(statement).rowcount
            connection.commit()
            return matched != 0
        except DBAPIError as exc:
            # A full disk skips the beat too: the next write that must land says why the run ends.
            if not is_locked_error(exc) and full_reason(exc) is None and read_only_reason(exc) is None:
                raise
            connection.rollback()
            return False


@contextlib.contextmanager
def lock_wait_at_most(connection: Connection, seconds: float | None) -> Iterator[Connection]:
    """Inside the block, each SQLite statement on ``connection`` waits at most ``seconds`` for a lock another
    process holds (a write the training thread may skip must not wait SQLite's own 30 s first), and the
    connection's wait is put back after it. None, or another database, changes nothing."""
    shorten = seconds is not None and connection.dialect.name == "sqlite"
    if shorten:
        connection.exec_driver_sql(f"PRAGMA busy_timeout={min(int(seconds * 1000), busy_timeout_ms())}")
    try:
        yield connection
    finally:
        if shorten:
            try:
                connection.exec_driver_sql(f"PRAGMA busy_timeout={busy_timeout_ms()}")
            except Exception:
                connection.invalidate()  # never pool a connection that gives up after a second


class LockBackoff:
    """When the training loop tries a skippable write again (a progress update, step points) after
    one found the database locked: each try blocks training for up to SKIPPABLE_WRITE_WAIT_S, so
    while another process holds the lock the tries come 2, 4, 8 ... up to ``max_s`` seconds apart,
    and a lock held for minutes costs training seconds, not a second per step. The first write
    that lands resets it."""

    def __init__(self, first_s: float = 2.0, max_s: float = 30.0):
        self.first_s, self.max_s = first_s, max_s
        self._wait_s = 0.0
        self._next_at = 0.0

    def due(self, now: float) -> bool:
        """``now`` is ``time.monotonic()``."""
        return now >= self._next_at

    def tried(self, landed: bool, now: float) -> None:
        self._wait_s = 0.0 if landed else min(max(self._wait_s * 2, self.first_s), self.max_s)
        self._next_at = now + self._wait_s


def _forget_engines_after_fork() -> None:
    # A forked child must not use the parent's pooled connections (SQLite forbids carrying
    # a connection across fork), nor close them under the parent: drop them unclosed and
    # let the child open its own.
    for engine in _engines.values():
        engine.dispose(close=False)
    _engines.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_engines_after_fork)


# --- migrations ---------------------------------------------------------------------------


@functools.cache
def schema_head() -> str:
    """The newest revision in MIGRATIONS_DIR, from the scripts' names (``NNNN_what.py``, revision
    ``NNNN``; tests/db/test_connection_upgrades.py holds it to Alembic's own head). A database already
    there is recognised from it with one read, without importing Alembic: about 0.2 s of CPU in
    every process that opens the database (each CLI command, supervisor and rank), most of which find
    nothing to migrate."""
    return max(path.name.split("_", 1)[0] for path in (MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))


def alembic_config(url: URL | str) -> Config:
    """An Alembic config for ``url`` built in code, so the app needs no alembic.ini."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    url_text = url if isinstance(url, str) else url.render_as_string(hide_password=False)
    # The config is a ConfigParser: a literal % (e.g. in a password) must be doubled.
    config.set_main_option("sqlalchemy.url", url_text.replace("%", "%%"))
    return config


def current_revisions(engine: Engine) -> set[str]:
    """The revisions recorded in the database's ``alembic_version`` table (empty if new)."""
    with engine.connect() as connection:
        return _recorded_revisions(connection)


def _recorded_revisions(connection: Connection) -> set[str]:
    """What Alembic's MigrationContext.get_current_heads reads, for its default version table."""
    if not inspect(connection).has_table("alembic_version"):
        return set()
    return set(connection.execute(text("SELECT version_num FROM alembic_version")).scalars())


def upgrade_to_head(engine: Engine) -> None:
    """Apply any pending migrations; a no-op read when the database is already current.

    Safe when several processes open a new database at once: SQLite files are migrated
    under an exclusive lock on ``<file>.migrate.lock``; PostgreSQL databases under an advisory
    lock held by the migration's own transaction, so processes on different machines queue
    too. Elsewhere a process whose upgrade fails because another one got there first accepts
    the result.
    """
    with _first_open(engine.url):
        current = current_revisions(engine)
    if current == {schema_head()}:
        return
    from alembic.script import ScriptDirectory

    config = alembic_config(engine.url)
    scripts = ScriptDirectory.from_config(config)
    heads = set(scripts.get_heads())
    if current == heads:
        return
    _refuse_unknown_revisions(engine, scripts, current)
    with _migration_lock(engine.url):
        # Another process may have finished the upgrade while this one waited.
        if current_revisions(engine) == heads:
            return
        try:
            with engine.connect() as connection:
                if connection.dialect.name == "postgresql":
                    # Released when the migration commits (or fails); a waiting process, here
                    # or on another machine, then reads the new revision and has nothing to do.
                    connection.execute(select(func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))
                    if _recorded_revisions(connection) == heads:
                        connection.rollback()
                        return
                _upgrade(config, connection)
        except Exception:
            if current_revisions(engine) != heads:
                raise


def _refuse_unknown_revisions(engine: Engine, scripts: ScriptDirectory, current: set[str]) -> None:
    """A revision this code has no migration for was written by a newer Parallax: upgrading is
    impossible and downgrading would lose its data, so say so and touch nothing."""
    unknown = sorted(revision for revision in current if _unknown_revision(scripts, revision))
    if unknown:
        raise DatabaseUnavailable(
            f"the database {masked_url(engine.url)} was written by a newer version of Parallax (schema revision "
            f"{', '.join(unknown)}; this version knows up to {', '.join(sorted(scripts.get_heads()))}): open it with "
            "that version or a newer one, or give another database with --db or PARALLAX_DB_URL"
        )


def _unknown_revision(scripts: ScriptDirectory, revision: str) -> bool:
    from alembic.util.exc import CommandError

    try:
        return scripts.get_revision(revision) is None
    except CommandError:  # alembic.util.exc: "Can't locate revision identified by ..."
        return True


def _upgrade(config: Config, connection: Connection) -> None:
    from alembic import command

    is_sqlite = connection.dialect.name == "sqlite"
    if is_sqlite:
        # Batch migrations rebuild a table by drop + rename; with foreign keys on, dropping
        # ``runs`` would cascade-delete every epoch row. Committing ends the transaction
        # SQLAlchemy began for the pragma, so Alembic starts and commits its own.
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        connection.commit()
    try:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        connection.commit()
    finally:
        if is_sqlite:
            # Never hand this connection back to the pool with foreign keys off.
            connection.invalidate()


@contextlib.contextmanager
def _first_open(url: URL) -> Iterator[None]:
    """The first connection to a SQLite file not yet in WAL mode switches it, which needs the file to
    itself: SQLite answers another process's connection "database is locked" at once, without
    waiting out busy_timeout. Processes that create the same file at once therefore queue for their
    first read, behind the migration lock."""
    path = sqlite_file(url)
    with contextlib.ExitStack() as held:
        if path is not None and not _in_wal_mode(path):
            with contextlib.suppress(OSError):  # a folder this process cannot write: SQLite's open says why
                held.enter_context(_migration_lock(url))
        yield


def _in_wal_mode(path: Path) -> bool:
    """Whether the file's header says WAL (bytes 18 and 19, the read and write versions, are 2)."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(100)
    except OSError:
        return False
    return len(header) == 100 and header[18:20] == b"\x02\x02"


@contextlib.contextmanager
def _migration_lock(url: URL) -> Iterator[None]:
    path = sqlite_file(url)
    if path is None or fcntl is None:
        yield
        return
    with open(f"{path}.migrate.lock", "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)

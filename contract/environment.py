"""Where Parallax keeps its state: ``PARALLAX_HOME`` and the database URL.

``PARALLAX_HOME`` (default ``./parallax_home``) holds the SQLite database, dataset caches,
logs and checkpoints. ``PARALLAX_DB_URL`` (or ``--db`` on the CLI) points at another database,
and ``PARALLAX_DATA_DIR`` at another folder for datasets and their caches.

What Parallax keeps there is its owner's alone (``keep_files_private``): the home folder is
0700 and the processes Parallax starts write with umask 077. ``PARALLAX_SHARE_GROUP`` names a
group to share it with instead (folder 2770 in that group, umask 007).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

SHARE_GROUP_ENV = "PARALLAX_SHARE_GROUP"


def parallax_home() -> Path:
    """The folder that holds every file Parallax writes (created on first use, private or shared
    as ``keep_files_private`` says)."""
    home = Path(os.environ.get("PARALLAX_HOME") or Path.cwd() / "parallax_home").expanduser().resolve()
    try:
        created = not home.is_dir()
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        if created:
            _set_home_mode(home, share_group())
    except OSError as exc:  # a file of that name, a read-only place, a path under a file
        raise ValueError(f"PARALLAX_HOME={str(home)!r} cannot be used: {exc.strerror or exc}; it must be a folder "
                         "Parallax can create and write") from None
    return home


def share_group() -> int | None:
    """The group id ``PARALLAX_SHARE_GROUP`` names (a group name or number), or None when unset."""
    raw = os.environ.get(SHARE_GROUP_ENV, "").strip()
    if not raw:
        return None
    import grp

    try:
        return grp.getgrgid(int(raw)).gr_gid if raw.isdigit() else grp.getgrnam(raw).gr_gid
    except (KeyError, OverflowError):
        raise ValueError(f"{SHARE_GROUP_ENV}={raw[:80]!r} is not allowed: no group of that name or number on this "
                         "machine; name a group to share PARALLAX_HOME with, or leave it unset to keep it "
                         "private") from None


def keep_files_private() -> None:
    """Make what this process (and every process it starts) writes its owner's alone: umask 077,
    or 007 with ``PARALLAX_SHARE_GROUP``, and the home folder 0700 (or 2770 in that group, so that
    what is made in it joins the group), where this user owns it. Called once by each entry point
    (``python -m trainer_backend``, the dashboard): workers and ranks inherit the umask. A home
    made by an older Parallax is tightened here; its sub-folders are reached only through it."""
    group = share_group()
    os.umask(0o007 if group is not None else 0o077)
    home = Path(os.environ.get("PARALLAX_HOME") or Path.cwd() / "parallax_home").expanduser()
    try:
        if not (home.is_dir() and home.stat().st_uid == os.geteuid()):
            return  # not made yet (parallax_home makes it so), or another user's to set
    except OSError:
        return  # parallax_home() names what is wrong with it when it is used
    try:
        _set_home_mode(home, group)
    except OSError as exc:
        how = "made private" if group is None else f"shared with group {group} ({SHARE_GROUP_ENV})"
        raise ValueError(f"PARALLAX_HOME={str(home)!r} cannot be {how}: {exc.strerror or exc}") from None


def _set_home_mode(home: Path, group: int | None) -> None:
    if group is None:
        home.chmod(stat.S_IMODE(home.stat().st_mode) & 0o700)
        return
    if home.stat().st_gid != group:
        os.chown(home, -1, group)
    home.chmod(0o2770)


def database_url(explicit: str | None = None) -> str:
    """The SQLAlchemy URL: ``explicit`` if given, else ``PARALLAX_DB_URL``, else SQLite in the home."""
    if explicit:
        return explicit
    from_env = os.environ.get("PARALLAX_DB_URL")
    if from_env:
        return from_env
    path = parallax_home() / "parallax.db"
    if share_group() is not None and not path.exists():
        # SQLite makes a database 0644 whatever the umask allows (and its -wal and -shm follow the
        # database's mode): made here first, it is writable by the group it is shared with.
        with contextlib.suppress(OSError):  # then SQLite reports the real problem
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o660))
    return sqlite_url(path)


def sqlite_url(path: Path | str) -> str:
    """The SQLAlchemy URL of the SQLite file at ``path``, whatever characters its folders hold.

    Pasted into ``sqlite:///`` as it is, a ``?`` starts the URL's query (the database becomes the
    part before it, a file beside the home) and ``%41`` is read as ``A`` (another folder):
    ``URL.create`` escapes the path so that parsing it gives back exactly ``path``."""
    from sqlalchemy import URL

    return URL.create("sqlite", database=os.fspath(path)).render_as_string(hide_password=False)


def data_dir() -> Path:
    """Downloaded and cached datasets (and the CPU's measured matmul peak, ``flops``):
    ``PARALLAX_DATA_DIR``, else ``PARALLAX_HOME/data``.

    Several homes may share one (a team's, or every test of a suite), so that a set is downloaded
    and decoded once: cache entries are keyed by the files and the preprocessing, and written
    under a lock."""
    chosen = os.environ.get("PARALLAX_DATA_DIR")
    path = Path(chosen).expanduser().resolve() if chosen else parallax_home() / "data"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        name = "PARALLAX_DATA_DIR=" if chosen else "PARALLAX_HOME's data folder "
        raise ValueError(f"{name}{str(path)!r} cannot be used: {exc.strerror or exc}; it must be a folder "
                         "Parallax can create and write") from None
    return path


def seconds_from_env(name: str, default: float) -> float:
    """A positive number of seconds from environment variable ``name`` (``default`` when unset);
    anything else is refused with a message naming the variable, its value and what is allowed."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e9:  # also refuses nan and inf
        raise ValueError(f"{name}={raw!r} is not allowed: give a number of seconds above 0 and below 1e9, "
                         f"e.g. {default:g}")
    return value


def whole_number_from_env(name: str, default: int, *, low: int = 1, high: int = 2**31 - 1) -> int:
    """A whole number in [low, high] from environment variable ``name`` (``default`` when unset);
    anything else is refused with a message naming the variable, its value and what is allowed."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    # isdecimal alone admits other scripts' digits ("٣"); int() would then accept them too.
    value = int(raw) if raw.isascii() and raw.isdecimal() and len(raw) <= 19 else None
    if value is None or not low <= value <= high:
        raise ValueError(f"{name}={raw!r} is not allowed: give a whole number from {low} to {high}, e.g. {default}")
    return value

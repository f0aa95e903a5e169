"""Where Parallax keeps its state: ``PARALLAX_HOME`` and the database URL.

``PARALLAX_HOME`` (default ``./parallax_home``) holds the SQLite database, dataset caches,
logs and checkpoints. ``PARALLAX_DB_URL`` (or ``--db`` on the CLI) points at another database,
and ``PARALLAX_DATA_DIR`` at another folder for datasets and their caches.
"""

from __future__ import annotations

import os
from pathlib import Path


def parallax_home() -> Path:
    """The folder that holds every file Parallax writes (created on first use)."""
    home = Path(os.environ.get("PARALLAX_HOME") or Path.cwd() / "parallax_home").expanduser().resolve()
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file of that name, a read-only place, a path under a file
        raise ValueError(f"PARALLAX_HOME={str(home)!r} cannot be used: {exc.strerror or exc}; it must be a folder "
                         "Parallax can create and write") from None
    return home


def database_url(explicit: str | None = None) -> str:
    """The SQLAlchemy URL: ``explicit`` if given, else ``PARALLAX_DB_URL``, else SQLite in the home."""
    if explicit:
        return explicit
    from_env = os.environ.get("PARALLAX_DB_URL")
    if from_env:
        return from_env
    return f"sqlite:///{parallax_home() / 'parallax.db'}"


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

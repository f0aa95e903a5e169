"""Keep training when the run's log cannot be written (a full disk, a removed folder).

    guard_output(on_failure=Recorder(engine, run_id).log_incomplete)

A launched run's stdout and stderr are its ``run.log``. A failed write there raises in whatever
printed (an epoch line, a warning) and would fail the run over a log line, though its metrics go
to the database. The guard wraps ``sys.stdout`` and ``sys.stderr``: a write that fails is dropped,
the first failure is reported once through ``on_failure``, and later writes are tried again, so
the log resumes when space comes back.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path

LOG_INCOMPLETE_NOTE = ("The run's log could not be written ({error}), so run.log is incomplete; "
                       "training went on and every epoch's metrics are recorded here.")


class GuardedStream:
    """A text stream whose failed writes are dropped and reported once."""

    def __init__(self, stream, on_failure: Callable[[OSError], None] | None):
        self._stream = stream
        self._on_failure = on_failure
        self._failed = False
        self._reporting = threading.local()

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._report(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._report(exc)

    def _report(self, exc: OSError) -> None:
        if self._failed or getattr(self._reporting, "active", False):
            return  # once; and never again from inside the report (it may print)
        self._failed = True
        if self._on_failure is None:
            return
        self._reporting.active = True
        try:
            self._on_failure(exc)
        except Exception:
            pass  # the log is already broken: there is nowhere left to say so
        finally:
            self._reporting.active = False

    def __getattr__(self, name: str):
        return getattr(self._stream, name)  # encoding, fileno, isatty, buffer, ...


def guard_output(on_failure: Callable[[OSError], None] | None = None) -> None:
    """Wrap this process's stdout and stderr (once; a second call changes nothing)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, GuardedStream):
            setattr(sys, name, GuardedStream(stream, on_failure))


def describe(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def reattach_deleted_log(log: Path) -> bool:
    """Point this process's stdout and stderr at a new ``log`` where they write to a file that was
    deleted (the run's folder removed mid-run): lines printed from now on land in the folder made
    again, not in a file no one can open. True if it did; a terminal or a pipe is left as it is."""
    moved = False
    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
        try:
            held = os.fstat(fd)
        except OSError:
            continue
        if not stat.S_ISREG(held.st_mode) or held.st_nlink > 0:
            continue
        with contextlib.suppress(Exception):
            stream.flush()
        try:
            # 0o666 as open() makes run.log: the umask (0077 in a private PARALLAX_HOME) decides
            new = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError:
            return moved
        os.dup2(new, fd, inheritable=True)
        os.close(new)
        moved = True
    return moved

"""Keep training when the run's log cannot be written (a full disk, a removed folder).

    guard_output(on_failure=Recorder(engine, run_id).log_incomplete)

A launched run's stdout and stderr are its ``run.log``. A failed write there raises in whatever
printed (an epoch line, a warning) and would fail the run over a log line, though its metrics go
to the database. The guard wraps ``sys.stdout`` and ``sys.stderr``: a write that fails is dropped,
the first failure is reported once through ``on_failure``, and later writes are tried again, so
the log resumes when space comes back.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

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

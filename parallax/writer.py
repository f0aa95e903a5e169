"""Logged values from the training thread to their store, never blocking training.

``log`` appends one entry (step, time, {name: value}) to a bounded deque: a few microseconds. A daemon
thread takes what is there every ``PARALLAX_SDK_FLUSH_S`` seconds (default 1) and writes it in one
statement (``Sink.write``). A write that fails (the database locked by another process, a PostgreSQL
server unreachable) keeps its points and is tried again at the next turn, in order; while the deque is
full new entries are counted, not stored. ``close`` writes what is left, trying for up to
``PARALLAX_DB_LOCK_WAIT_S`` (300 s by default), and returns what could not be written and why: the
caller says it in one line.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Protocol

FLUSH_ENV = "PARALLAX_SDK_FLUSH_S"
DEFAULT_FLUSH_S = 1.0
# Entries (log calls) held while the store cannot take them: at 100 calls a second, an unreachable
# database for half an hour. A call holds a small dict: about 100 MB at most.
MAX_PENDING_CALLS = 200_000

Entry = tuple  # (step, wall time, {name: value})


class Sink(Protocol):
    def write(self, entries: list[Entry]) -> None:
        """Store the entries, all or none; raise where they could not be (they are tried again)."""

    def tick(self) -> None:
        """Called at each turn of the writer's thread (a heartbeat is due now and then)."""


class BackgroundWriter:
    def __init__(self, sink: Sink, *, flush_s: float | None = None, max_pending: int = MAX_PENDING_CALLS,
                 describe_error: Callable[[BaseException], str] = lambda exc: f"{type(exc).__name__}: {exc}"):
        from contract.environment import seconds_from_env  # the database's packages load with init, not with the import

        self.sink, self.max_pending = sink, max_pending
        self.flush_s = seconds_from_env(FLUSH_ENV, DEFAULT_FLUSH_S) if flush_s is None else flush_s
        self.describe_error = describe_error
        self.queue: collections.deque[Entry] = collections.deque()
        self.refused_points = 0  # values not stored because the queue was full
        self.written_calls = 0
        self.last_error: str | None = None
        self._batch: list[Entry] = []  # taken from the queue, not yet written
        self._lock = threading.Lock()  # one write at a time: the thread's, or close's last one
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="parallax-log-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, entry: Entry) -> None:
        """The training thread's whole cost: one length check and one append."""
        if len(self.queue) + len(self._batch) >= self.max_pending:
            self.refused_points += len(entry[2])
            return
        self.queue.append(entry)

    def pending(self) -> int:
        return len(self.queue) + len(self._batch)

    def pending_points(self) -> int:
        return sum(len(values) for entries in (list(self._batch), list(self.queue)) for _, _, values in entries)

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            self.flush()
            try:
                self.sink.tick()
            except Exception as exc:  # a beat that failed: the next one follows; the writes say what is wrong
                self.last_error = self.describe_error(exc)

    def flush(self) -> bool:
        """Write what is queued; False where the write failed (the entries stay, for the next try)."""
        with self._lock:
            queue = self.queue
            while queue:
                self._batch.append(queue.popleft())
            if not self._batch:
                return True
            try:
                self.sink.write(self._batch)
            except Exception as exc:
                self.last_error = self.describe_error(exc)
                return False
            self.written_calls += len(self._batch)
            self._batch = []
            self.last_error = None
            return True

    def close(self, wait_s: float) -> tuple[int, str | None]:
        """Stop the thread and write what is left, trying for up to ``wait_s`` seconds; returns how many
        values (points) were not written (0 for none) and why."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=wait_s)
        deadline = time.monotonic() + wait_s
        delay_s = 0.1
        while not self.flush() and time.monotonic() < deadline:
            time.sleep(min(delay_s, max(0.0, deadline - time.monotonic())))
            delay_s = min(delay_s * 2, 2.0)
        unwritten = self.pending_points() + self.refused_points
        if not unwritten:
            return 0, None
        why = self.last_error if self.pending() else None
        if self.refused_points:
            full = (f"{self.refused_points} were logged while {self.max_pending:,} log calls were already waiting "
                    "to be written")
            why = f"{why}; {full}" if why else full
        return unwritten, why

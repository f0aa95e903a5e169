"""Logged values from the training thread to their store: nothing refused, memory bounded.

``log`` appends one entry (step, time, {name: value}) to a deque: a few microseconds. A daemon thread
takes everything queued every ``PARALLAX_SDK_FLUSH_S`` seconds (default 1), or at once when
``BATCH_CALLS`` calls are waiting, and writes it in one batch (``Sink.write``). A write that fails (the
database locked by another process, a PostgreSQL server unreachable) keeps its points and is tried again
at the next turn, in order.

Back-pressure: while ``max_pending`` calls are queued (the writer busy with the batch before), ``log``
waits for room rather than refusing the value. The time it waited is counted (``waited_s``) and recorded
on the run, so a user sees that logging, not training, took it. Only where the store has refused every
write for ``give_up_s`` (an online run's: ``PARALLAX_DB_LOCK_WAIT_S``, 300 s by default) while ``log`` waited does it stop
waiting: training goes on, and each value it could not hold is counted and said at the end. ``close``
writes what is left, trying for up to its ``wait_s``, and returns what could not be written and why: the
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
# Calls held at most before ``log`` waits: with the batch being written beside them, about twice this
# many small dicts (a few hundred bytes each: tens of MB at most).
MAX_PENDING_CALLS = 100_000
# The writer does not wait for its next turn once this many calls are queued: big batches are cheap to
# write, and a script logging at full speed fills the queue within a turn.
BATCH_CALLS = 20_000
# How often a waiting ``log`` looks again, where the writer's signal could slip between its check and
# its wait.
ROOM_POLL_S = 0.05
# How long a waiting ``log`` keeps waiting while every write fails (an online run passes the database's
# own lock wait, PARALLAX_DB_LOCK_WAIT_S).
DEFAULT_GIVE_UP_S = 300.0

Entry = tuple  # (step, wall time, {name: value})


class Sink(Protocol):
    def write(self, entries: list[Entry]) -> None:
        """Store the entries, all or none; raise where they could not be (they are tried again)."""

    def tick(self) -> None:
        """Called at each turn of the writer's thread (a heartbeat is due now and then)."""


class BackgroundWriter:
    def __init__(self, sink: Sink, *, flush_s: float | None = None, max_pending: int = MAX_PENDING_CALLS,
                 describe_error: Callable[[BaseException], str] = lambda exc: f"{type(exc).__name__}: {exc}",
                 give_up_s: float | None = None):
        # The database's packages load with init, not with the import.
        from contract.environment import seconds_from_env

        self.sink, self.max_pending = sink, max_pending
        self.flush_s = seconds_from_env(FLUSH_ENV, DEFAULT_FLUSH_S) if flush_s is None else flush_s
        self.give_up_s = DEFAULT_GIVE_UP_S if give_up_s is None else give_up_s
        self.batch_calls = max(1, min(BATCH_CALLS, max_pending // 2))
        self.describe_error = describe_error
        self.queue: collections.deque[Entry] = collections.deque()
        self.refused_points = 0  # values not stored: the store refused every write while log waited for room
        self.written_calls = 0
        self.waited_s = 0.0  # how long log calls waited for room, in all
        self.waits = 0  # how many log calls waited
        self.last_error: str | None = None
        self._failing_since: float | None = None  # when the first of the writes failing now failed
        self._batch: list[Entry] = []  # taken from the queue, not yet written
        self._lock = threading.Lock()  # one write at a time: the thread's, or close's last one
        self._stop = threading.Event()
        self._due = threading.Event()  # a full batch is waiting: write it without waiting for the turn
        self._room = threading.Event()  # a write ended: a waiting log looks again
        self._thread = threading.Thread(target=self._run, name="parallax-log-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, entry: Entry) -> None:
        """The training thread's cost: one length check and one append, and a wait while the queue is full."""
        queue = self.queue
        if len(queue) >= self.max_pending and not self._wait_for_room():
            self.refused_points += len(entry[2])
            return
        queue.append(entry)
        if len(queue) == self.batch_calls:
            self._due.set()

    def _wait_for_room(self) -> bool:
        """Wait until the queue has room; False where the store has refused every write for ``give_up_s``."""
        started = time.perf_counter()
        self.waits += 1
        self._due.set()
        try:
            while len(self.queue) >= self.max_pending:
                if not self._thread.is_alive():  # not started, or this is a forked child: write here
                    if not self.flush() and self._given_up():
                        return False
                    continue
                self._room.clear()
                if len(self.queue) < self.max_pending:
                    break
                self._room.wait(ROOM_POLL_S)
                if self._given_up():
                    return False
            return True
        finally:
            self.waited_s += time.perf_counter() - started

    def _given_up(self) -> bool:
        failing = self._failing_since
        return failing is not None and time.monotonic() - failing >= self.give_up_s

    def wait_record(self) -> dict[str, float | int]:
        """How long ``log`` waited for room, as a run records it: seconds in all and how many calls waited."""
        return {"waited_s": round(self.waited_s, 3), "waits": self.waits}

    def pending(self) -> int:
        return len(self.queue) + len(self._batch)

    def pending_points(self) -> int:
        return sum(len(values) for entries in (list(self._batch), list(self.queue)) for _, _, values in entries)

    def _run(self) -> None:
        next_tick = time.monotonic() + self.flush_s
        while not self._stop.is_set():
            self._due.wait(max(0.0, next_tick - time.monotonic()))
            self._due.clear()
            if self._stop.is_set():
                break
            self.flush()
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self.flush_s
                try:
                    self.sink.tick()
                except Exception as exc:  # a beat that failed: the next one follows; the writes say what is wrong
                    self.last_error = self.describe_error(exc)

    def flush(self) -> bool:
        """Write what is queued; False where the write failed (the entries stay, for the next try)."""
        with self._lock:
            queue = self.queue
            # A batch the store keeps refusing grows by at most one queue: memory stays bounded.
            if len(self._batch) < self.max_pending:
                while queue:
                    self._batch.append(queue.popleft())
            self._room.set()  # the queue is empty: a waiting log goes on while this batch is written
            if not self._batch:
                return True
            try:
                self.sink.write(self._batch)
            except Exception as exc:
                self.last_error = self.describe_error(exc)
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                return False
            finally:
                self._room.set()
            self.written_calls += len(self._batch)
            self._batch = []
            self.last_error = None
            self._failing_since = None
            return True

    def close(self, wait_s: float) -> tuple[int, str | None]:
        """Stop the thread and write what is left, trying for up to ``wait_s`` seconds; returns how many
        values (points) were not written (0 for none) and why."""
        self._stop.set()
        self._due.set()
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
            full = (f"{self.refused_points} could not be held: the store refused every write for "
                    f"{self.give_up_s:g} s while {self.max_pending:,} log calls were waiting")
            why = f"{why}; {full}" if why else full
        return unwritten, why

"""A run's life as its supervisor lives it: its turn in the queue, its heartbeat, and cancel as an exception.

    with Heartbeat(engine, run_id):            # stamps the run every few seconds; a cancel mark stops it
        if wait_for_turn(engine, run_id):      # blocks until its devices are free, then claims the run
            ...                                # a SIGTERM (``cancel``) raises RunCancelled here

The control side (control.lifecycle) launches and cancels; this is the other end of both.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import threading
import time

from db import run_state as state
from db import store
from db.connection import retry_when_locked
from contract.environment import parallax_home, whole_number_from_env

QUEUE_POLL_S = 1.0


class RunCancelled(BaseException):
    """Raised in a run's main thread by SIGTERM: ``cancel`` asked the run to stop.

    A BaseException, like KeyboardInterrupt, so no ``except Exception`` in training swallows it."""


def cpu_run_slots() -> int:
    """How many CPU training runs may run at once (they share the cores): PARALLAX_CPU_RUNS, default 1."""
    return whole_number_from_env("PARALLAX_CPU_RUNS", 1, low=1, high=1024)


def can_start(run_id: int, active: list[state.ActiveRun], cpu_slots: int) -> bool:
    """Queue rule, in launch order, among the runs on the same host: a run starts when none of its
    GPUs is held by a running run or wanted by an earlier queued one; CPU runs also wait while
    ``cpu_slots`` CPU runs run."""
    me = next(r for r in active if r.id == run_id)
    # Devices belong to a machine: on a shared database, runs on other hosts hold none of ours.
    here = me.host or socket.gethostname()
    active = [r for r in active if (r.host or here) == here]
    running = [r for r in active if r.status == "running"]
    earlier = [r for r in active if r.status == "queued" and r.id < run_id]
    if me.uses_cpu:
        return sum(r.uses_cpu for r in running) < cpu_slots and not any(r.uses_cpu for r in earlier)
    return not any(me.gpus & r.gpus for r in running + earlier)


@contextlib.contextmanager
def _queue_lock():
    """One process at a time decides who starts, so two waiting runs never both take a GPU."""
    with open(parallax_home() / "queue.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class ClaimedElsewhere(Exception):
    """Another process claimed the run (a second ``supervisor N`` for one queued run): this one leaves
    the run to it, untouched."""


def claim_if_free(engine, run_id: int) -> bool:
    """Claim the run now if its devices are free (queued -> running), without waiting; whether it did.

    A launched supervisor calls this before it imports the training code (torch, timm: about 4 s of a 2-core machine's
    time), so that on an idle machine a run leaves the queue as soon as its supervisor has started, and holds
    its devices while it imports; ``wait_for_turn`` then finds the run already this process's."""
    with _queue_lock():
        state.mark_lost_runs(engine)
        active = state.active_runs(engine)
        me = next((r for r in active if r.id == run_id), None)
        if me is None or me.status != "queued" or not can_start(run_id, active, cpu_run_slots()):
            return False
        if not _claim(engine, run_id):
            return False
        _record_process(engine, run_id)
        return True


def _claim(engine, run_id: int) -> bool:
    # Through the waits every must-land write has: a locked database is waited out, and a full or
    # read-only one is one line naming it (DatabaseFullError, DatabaseReadOnlyError), never an
    # OperationalError and its traceback recorded as the run's reason.
    return retry_when_locked(lambda: state.claim(engine, run_id), what="claim the run")


def _record_process(engine, run_id: int) -> None:
    retry_when_locked(lambda: store.set_process(engine, run_id, pid=os.getpid(), host=socket.gethostname()),
                      what="record the run's process")


def _claimed_by_me(run: state.ActiveRun) -> bool:
    return run.status == "running" and run.pid == os.getpid() and run.host == socket.gethostname()


def wait_for_turn(engine, run_id: int, echo: bool = True) -> bool:
    """Block until the run may start and claim it (queued -> running). False if it was cancelled;
    ClaimedElsewhere if another process claimed it first; True at once for a run this process claimed
    already (``claim_if_free``)."""
    announced = False
    while True:
        with _queue_lock():
            state.mark_lost_runs(engine)  # a dead run must not hold its devices forever
            active = state.active_runs(engine)
            me = next((r for r in active if r.id == run_id), None)
            if me is None:
                return False
            if _claimed_by_me(me):
                return True
            if me.status != "queued":
                raise ClaimedElsewhere(f"run {run_id} is already {me.status} in process {me.pid} on {me.host}: "
                                       "this supervisor leaves it to that one")
            if can_start(run_id, active, cpu_run_slots()):
                if _claim(engine, run_id):
                    # The claimer is the run's process, whoever started it (a second supervisor may win).
                    _record_process(engine, run_id)
                    return True
                continue  # claimed or cancelled meanwhile: the next look says which
        if echo and not announced:
            ahead = [r.id for r in active if r.id < run_id]
            print(f"run_id={run_id} queued: waiting for devices held by run(s) {ahead}", flush=True)
            announced = True
        time.sleep(QUEUE_POLL_S)


class Heartbeat:
    """Beats from the run's main process every few seconds, whatever the training is doing.

    A beat that finds the run cancelled (or pruned by its search) stops it as ``cancel``'s signal would (SIGTERM to this
    process, whose ``install_cancel_handler`` turns it into RunCancelled): a cancel from another
    machine sharing the database can mark the run but cannot signal it."""

    def __init__(self, engine, run_id: int, interval_s: float = state.HEARTBEAT_INTERVAL_S):
        self._engine, self._run_id, self._interval = engine, run_id, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-run-{run_id}", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                if state.heartbeat(self._engine, self._run_id):
                    continue
                # Not stamped: the run has ended meanwhile, or the database was locked.
                if store.get_run(self._engine, self._run_id).status in ("cancelled", "pruned"):
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
            except Exception:  # a locked or unreachable database must not end the run
                continue

    def __enter__(self) -> Heartbeat:
        state.heartbeat(self._engine, self._run_id)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=self._interval + 1)


def raise_cancelled(signum, frame) -> None:
    signal.signal(signum, signal.SIG_IGN)  # a second signal must not interrupt the clean-up
    raise RunCancelled(f"cancelled (signal {signal.Signals(signum).name})")


def install_cancel_handler() -> None:
    signal.signal(signal.SIGTERM, raise_cancelled)


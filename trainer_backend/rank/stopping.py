"""A stop asked of a running job (Slurm's warning before its time limit or a preemption), taken at the
next step boundary that every rank agrees on.

    stop = StopRequest(folder, strategy)       # every rank
    if stop(step): ...                          # after an optimizer step; True on every rank at the same step

The batch script (control/slurm_job.py) touches ``stop-requested`` in the run's folder. Each rank looks for it
about every ``STOP_CHECK_S`` seconds, after an optimizer step, and the ranks agree through an all-reduce that no
step waits for (``StopRequest``); the first rank that saw it is enough. The loop then raises
``StopAtStep``; the trainer saves a mid-epoch resume point (rank/resume.py) and raises ``StoppedAtStep``,
which the torchrun supervisor turns into an attempt that leaves its run running for the next attempt to resume.

In a job Slurm started, SIGTERM asks the same (``stop_on_sigterm``): Slurm sends it to every process of a job it
preempts or requeues (``scontrol requeue``, ``PreemptMode=REQUEUE``) and kills them ``KillWait`` (30 s by default)
or the partition's ``GraceTime`` later. Where no stop is taken within ``TERM_GRACE_S`` (a collective stuck on a
dead peer), rank 0 ends as its SIGTERM handler ended it before (it records how the attempt ended) and every other
rank by SIGALRM's default action. The grace is timed outside Python's signal handling, so that a rank blocked in
a collective's C++ wait ends within it too (``stop_on_sigterm``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from contract.environment import seconds_from_env
from contract.world import SUBMITTED_RUN_ENV, torchrun_world
from trainer_backend.rank.divergence import start_host_copy

STOP_FILE = "stop-requested"
STOP_CHECK_S = 2.0  # seconds between two looks: a request is taken within two looks and a step or two
STOP_CHECK_ENV = "PARALLAX_STOP_CHECK_S"
MAX_STEPS_BETWEEN_LOOKS = 10_000
TERM_GRACE_S = 20.0  # SIGTERM to a step stop, inside torchrun's and Slurm's 30 s before SIGKILL
ESCALATE_WAIT_S = 0.5  # after the grace, how long the main thread has to take the escalation itself
_signalled: list[str] = []  # the signal that asked this process to stop, once it has
_taken: list[str] = []  # why the ranks stopped at a step, once they have (stop_taken)
_settled = threading.Event()  # a stop was taken, or the process records an end of its own: no escalation
_grace: dict = {}  # the grace's thread: its pipe, whether it escalates, its length, what it records when blocked
ASKED_BY_FILE, ASKED_BY_SIGNAL = 1.0, 2.0  # all-reduced with max: a signal anywhere names the stop


class StopAtStep(Exception):
    """Raised by the training loop on every rank after optimizer step ``step`` of the epoch: ``totals`` (this
    rank's [loss_sum, correct, count] so far in this attempt) and ``train_time_s`` (its training time) go into
    the resume point."""

    def __init__(self, step: int, totals: torch.Tensor, train_time_s: float):
        super().__init__(f"stop asked: stopped after step {step}")
        self.step, self.totals, self.train_time_s = step, totals, train_time_s


class StoppedAtStep(BaseException):
    """The rank saved its mid-epoch resume point and stops: not a failure (no failure note, no failed run)."""

    def __init__(self, epoch: int, step: int):
        super().__init__(f"stopped on request after step {step} of epoch {epoch}; its resume point is saved")
        self.epoch, self.step = epoch, step


def stop_on_sigterm(escalate: Callable[[int, object], None] | None, grace_s: float = TERM_GRACE_S) -> None:
    """From now on SIGTERM asks this process to stop at the next step its ranks agree on (``StopRequest``).
    If no stop is taken within ``grace_s``: ``escalate(signum, frame)`` runs in the main thread (the process's
    SIGTERM handling until now), or, with None, SIGALRM's default action ends the process. Another SIGTERM
    (Slurm signals every process, torchrun its workers again), or one after a stop was taken, changes nothing.

    The grace is kept by a thread of its own, which hears the signal through Python's wakeup file descriptor:
    the interpreter's C-level handler writes it at once, while the Python handler waits for the main thread to
    run Python again, which a rank blocked in a collective's C++ wait on a dead peer never does. Where the main
    thread has not taken ``escalate`` within ``ESCALATE_WAIT_S`` after the grace (it is that blocked rank),
    the thread runs what ``when_blocked`` registered (rank 0 records why the attempt ended) and ends the
    process (exit status 128 + SIGTERM)."""
    if escalate is None:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    else:
        def escalated(signum, frame) -> None:
            if not _settled.is_set():
                _settled.set()  # the main thread handles it: the watch stands down
                escalate(signal.SIGTERM, frame)

        signal.signal(signal.SIGALRM, escalated)
    _grace.update(escalates=escalate is not None, grace_s=grace_s)

    def asked(signum, frame) -> None:
        if not _signalled and not _taken:
            _signalled.append(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, asked)
    signal.set_wakeup_fd(_watch_signals(), warn_on_full_buffer=False)


def when_blocked(record: Callable[[float], None] | None) -> None:
    """What to record (``record(grace_s)``), from the grace's thread, before it ends a process whose main thread
    stayed blocked past the grace; None: nothing."""
    _grace["record"] = record


def _watch_signals() -> int:
    """The write end of the pipe the grace's thread reads signals from (started once per process)."""
    if "write_fd" not in _grace:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # the C-level handler must never block
        _grace["write_fd"] = write_fd
        threading.Thread(target=_keep_grace, args=(read_fd,), name="sigterm-grace", daemon=True).start()
    return _grace["write_fd"]


def _keep_grace(read_fd: int) -> None:
    while True:
        try:
            heard = os.read(read_fd, 256)
        except OSError:
            return
        if signal.SIGTERM not in heard or _grace.get("heard") or _taken or _settled.is_set():
            continue
        _grace["heard"] = True
        if not _signalled:
            _signalled.append("SIGTERM")
        if _settled.wait(_grace["grace_s"]):
            continue  # taken, or the process records a failure of its own
        if not _grace["escalates"]:
            os.kill(os.getpid(), signal.SIGALRM)  # its default action ends the process, blocked or not
            continue
        signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)
        if _settled.wait(ESCALATE_WAIT_S):
            continue
        record = _grace.get("record")
        try:
            if record is not None:
                record(_grace["grace_s"])
        except Exception as exc:  # the process ends all the same; its output says why the record is missing
            print(f"parallax: could not record the end of this attempt: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
        finally:
            print(f"parallax: SIGTERM {_grace['grace_s']:g} s ago and no step was reached (blocked in a "
                  "collective): this process ends", file=sys.stderr, flush=True)
            os._exit(128 + signal.SIGTERM)


def _settle() -> None:
    _settled.set()


def stop_escalating() -> None:
    """This process has stopped training for a reason of its own (an error it now records): a SIGTERM that asked
    for a stop before it no longer ends the process when its grace runs out, which could cut that record short."""
    _settle()


def stop_taken() -> str | None:
    """Why this process's ranks stopped at a step: "SIGTERM" where a rank was signalled, "stop file" where
    only Slurm's warning asked; None before a stop was taken."""
    return _taken[0] if _taken else None


def stop_request(folder: Path, strategy) -> StopRequest | None:
    """The request a torchrun job, or a Slurm job's one task (single, dp, mp), looks for; None for a run started
    otherwise."""
    in_job = torchrun_world() is not None or bool(os.environ.get(SUBMITTED_RUN_ENV))
    return StopRequest(folder, strategy) if in_job else None


class StopRequest:
    """The ranks' agreement on a stop, looked for after optimizer steps about every ``every_s`` seconds
    (``PARALLAX_STOP_CHECK_S``). A look starts an all-reduce of [asked here, seconds per step here] without
    waiting for it and reads the one the look before started, long done by then: no look waits for the
    device or for the slowest peer, except where that peer is a whole look behind. Every rank reads the same
    reduced numbers, so all stop at the same look, and all take the same number of steps to the next one (the
    slowest rank's pace), which keeps their collectives in step. ``clock``: seconds (time.monotonic)."""

    def __init__(self, folder: Path, strategy, every_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.path, self.strategy, self.clock = Path(folder) / STOP_FILE, strategy, clock
        self.every_s = seconds_from_env(STOP_CHECK_ENV, STOP_CHECK_S) if every_s is None else every_s
        self._calls = 0
        self._next_look = 1  # the first look after the first optimizer step
        self._last_look: tuple[float, int] | None = None  # (clock, calls) at the last look
        self._in_flight: tuple | None = None  # (collective's work, host values, CUDA event) of the last look

    def __call__(self, step: int, total_steps: int) -> bool:
        """Whether to stop after this optimizer step (never after the epoch's last: the epoch then simply ends)."""
        self._calls += 1
        if step == total_steps:
            # The epoch's collectives follow: nothing of this one is left in flight. A request it carried is asked
            # again at the next look (the file stays, a signal is remembered).
            self._take_in_flight()
            self._next_look, self._last_look = max(self._next_look, self._calls + 1), None
            return False
        if self._calls < self._next_look:
            return False
        now = self.clock()
        answer = self._take_in_flight()
        if answer is not None and answer[0] > 0:
            _taken.append("SIGTERM" if answer[0] == ASKED_BY_SIGNAL else "stop file")
            _settle()  # taken: no escalation while the point is saved, nor after
            if self.strategy.is_main:  # taken: the next attempt must not stop again at once
                self.path.unlink(missing_ok=True)
            return True
        mine = ASKED_BY_SIGNAL if _signalled else ASKED_BY_FILE if self.path.exists() else 0.0
        pace_s = (now - self._last_look[0]) / (self._calls - self._last_look[1]) if self._last_look else 0.0
        self._in_flight = _start_max([mine, pace_s], self.strategy.output_device)
        self._last_look = now, self._calls
        agreed_pace_s = answer[1] if answer is not None else 0.0
        steps = round(self.every_s / agreed_pace_s) if agreed_pace_s > 0 else 1
        self._next_look = self._calls + max(1, min(MAX_STEPS_BETWEEN_LOOKS, steps))
        return False

    def _take_in_flight(self) -> list[float] | None:
        if self._in_flight is None:
            return None
        work, values, event = self._in_flight
        self._in_flight = None
        if work is not None:
            work.wait()  # a look ago: done unless a peer is a whole look behind (on a GPU, the stream waits)
        if event is not None:
            event.synchronize()
        return values.tolist()


def _start_max(values: list[float], device: torch.device) -> tuple:
    """Start the all-reduce (max) of ``values`` over the world, without waiting for it: (its work, the tensor
    the host reads the answer from, the CUDA event after which it may). On a GPU the values go up from pinned
    memory and the answer comes back into it, both copies without a wait; the host reads nothing until the
    next look."""
    distributed = dist.is_available() and dist.is_initialized()
    local = torch.tensor(values, dtype=torch.float64)
    if device.type != "cuda":
        return (dist.all_reduce(local, op=dist.ReduceOp.MAX, async_op=True) if distributed else None), local, None
    on_device = local.pin_memory().to(device, non_blocking=True)
    if distributed:
        dist.all_reduce(on_device, op=dist.ReduceOp.MAX, async_op=True).wait()  # the stream waits, not the host
    host, event = start_host_copy(on_device, device)
    return None, host, event

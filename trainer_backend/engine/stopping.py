"""A stop asked of a running job (Slurm's warning before its time limit or a preemption), taken at the
next step boundary that every rank agrees on.

    stop = StopRequest(folder, strategy)       # every rank
    if stop(step): ...                          # after an optimizer step; True on every rank at the same step

The batch script (control/slurm_job.py) touches ``stop-requested`` in the run's folder. Each rank looks for it
after every ``STOP_CHECK_STEPS``-th optimizer step and the ranks agree through one all-reduce of one number
(so between checks a step costs nothing); the first rank that saw it is enough. The loop then raises
``StopAtStep``; the trainer saves a mid-epoch resume point (engine/resume.py) and raises ``StoppedAtStep``,
which the torchrun worker turns into an attempt that leaves its run running for the next attempt to resume.

In a job Slurm started, SIGTERM asks the same (``stop_on_sigterm``): Slurm sends it to every process of a job it
preempts or requeues (``scontrol requeue``, ``PreemptMode=REQUEUE``) and kills them ``KillWait`` (30 s by default)
or the partition's ``GraceTime`` later. Where no stop is taken within ``TERM_GRACE_S`` (a collective stuck on a
dead peer), rank 0 ends as its SIGTERM handler ended it before (it records how the attempt ended) and every other
rank by SIGALRM's default action, which a process blocked in a collective cannot delay.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import torch

from contract.world import SUBMITTED_RUN_ENV, torchrun_world

STOP_FILE = "stop-requested"
STOP_CHECK_STEPS = 10  # optimizer steps between two looks; Slurm's warning comes 120 s before the limit
TERM_GRACE_S = 20.0  # SIGTERM to a step stop, inside torchrun's and Slurm's 30 s before SIGKILL
_signalled: list[str] = []  # the signal that asked this process to stop, once it has
_taken: list[str] = []  # why the ranks stopped at a step, once they have (stop_taken)
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
    If no stop is taken within ``grace_s``: ``escalate(signum, frame)`` runs (the process's SIGTERM handling
    until now), or, with None, SIGALRM's default action ends the process: the kernel's doing, which a rank
    blocked in a collective cannot delay. Another SIGTERM (Slurm signals every process, torchrun its workers
    again), or one after a stop was taken, changes nothing."""

    def asked(signum, frame) -> None:
        if _signalled or _taken:
            return
        _signalled.append(signal.Signals(signum).name)
        if escalate is None:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
        else:
            signal.signal(signal.SIGALRM, lambda _, later_frame: escalate(signum, later_frame))
        signal.setitimer(signal.ITIMER_REAL, grace_s)

    signal.signal(signal.SIGTERM, asked)


def stop_escalating() -> None:
    """This process has stopped training for a reason of its own (an error it now records): a SIGTERM that asked
    for a stop before it no longer ends the process when its grace runs out, which could cut that record short."""
    if _signalled and not _taken:
        signal.setitimer(signal.ITIMER_REAL, 0)


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
    def __init__(self, folder: Path, strategy, every: int = STOP_CHECK_STEPS):
        self.path, self.strategy, self.every = Path(folder) / STOP_FILE, strategy, every
        self._calls = 0

    def __call__(self, step: int, total_steps: int) -> bool:
        """Whether to stop after this optimizer step (never after the epoch's last: the epoch then simply ends)."""
        self._calls += 1
        if self._calls % self.every or step == total_steps:
            return False
        mine = ASKED_BY_SIGNAL if _signalled else ASKED_BY_FILE if self.path.exists() else 0.0
        asked = self.strategy.all_reduce(torch.tensor([mine], dtype=torch.float64,
                                                      device=self.strategy.output_device), "max").item()
        if asked == 0:
            return False
        _taken.append("SIGTERM" if asked == ASKED_BY_SIGNAL else "stop file")
        signal.setitimer(signal.ITIMER_REAL, 0)  # taken: no escalation while the point is saved, nor after
        if self.strategy.is_main:  # taken: the next attempt must not stop again at once
            self.path.unlink(missing_ok=True)
        return True

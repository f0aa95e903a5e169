"""A stop asked of a running job (Slurm's warning before its time limit or a preemption), taken at the
next step boundary that every rank agrees on.

    stop = StopRequest(folder, strategy)       # every rank
    if stop(step): ...                          # after an optimizer step; True on every rank at the same step

The batch script (control/slurm_job.py) touches ``stop-requested`` in the run's folder. Each rank looks for it
after every ``STOP_CHECK_STEPS``-th optimizer step and the ranks agree through one all-reduce of one number
(so between checks a step costs nothing); the first rank that saw it is enough. The loop then raises
``StopAtStep``; the trainer saves a mid-epoch resume point (engine/resume.py) and raises ``StoppedAtStep``,
which the torchrun worker turns into an attempt that leaves its run running for the next attempt to resume.
"""

from __future__ import annotations

from pathlib import Path

import torch

from contract.world import torchrun_world

STOP_FILE = "stop-requested"
STOP_CHECK_STEPS = 10  # optimizer steps between two looks; Slurm's warning comes 120 s before the limit


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


def stop_request(folder: Path, strategy) -> StopRequest | None:
    """The request a torchrun job (the one a Slurm job runs) looks for; None for a run started otherwise."""
    return StopRequest(folder, strategy) if torchrun_world() is not None else None


class StopRequest:
    def __init__(self, folder: Path, strategy, every: int = STOP_CHECK_STEPS):
        self.path, self.strategy, self.every = Path(folder) / STOP_FILE, strategy, every
        self._calls = 0

    def __call__(self, step: int, total_steps: int) -> bool:
        """Whether to stop after this optimizer step (never after the epoch's last: the epoch then simply ends)."""
        self._calls += 1
        if self._calls % self.every or step == total_steps:
            return False
        asked = torch.tensor([1.0 if self.path.exists() else 0.0], dtype=torch.float64,
                             device=self.strategy.output_device)
        if self.strategy.all_reduce(asked, "max").item() == 0:
            return False
        if self.strategy.is_main:  # taken: the next attempt must not stop again at once
            self.path.unlink(missing_ok=True)
        return True

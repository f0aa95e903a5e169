"""The optimizer at the run's peak lr, and its learning-rate schedule, stepped once per optimizer step.

    schedule = attach_schedule(optimizer, config, batches_per_epoch=len(train_loader))

The schedule sets every parameter group's lr just before each optimizer step (an optimizer step
pre-hook), so after a step ``optimizer.param_groups[0]["lr"]`` is the lr that step used, in every
loop (the pipeline's own included): an epoch's recorded lr is its last optimizer step's. Only real
optimizer steps advance it: accumulation batches do not, nor does a step the fp16 GradScaler skips
for an overflow.

With T optimizer steps in the run and W of warmup, the lr of step k (counted from 0) is
``config.base_lr * lr_factor(...)``:

    warmup, k < W      (k + 1) / W                      linear, full lr at the last warmup step
    after it           p = (k - W) / (T - W), in [0, 1)
      constant         1
      cosine           (1 + cos(pi p)) / 2
      step             0.1 ** floor(3 p)                a tenth after each third of the steps
      onecycle         ONECYCLE_FLOOR + (1 - ONECYCLE_FLOOR) (1 + cos(pi p)) / 2, after a warmup from
                       1/25 of the lr (W = 30 % of T when no warmup is given): torch's OneCycleLR
                       defaults, with a linear rise and no momentum cycling
"""

from __future__ import annotations

import math

import torch

from contract.config import RunConfig

STEP_DECAY, STEP_PARTS = 0.1, 3
ONECYCLE_START = 1 / 25  # OneCycleLR's div_factor
ONECYCLE_FLOOR = ONECYCLE_START / 1e4  # and its final_div_factor
ONECYCLE_DEFAULT_WARMUP = 0.3  # OneCycleLR's pct_start


def warmup_steps(kind: str, warmup_epochs: float, steps_per_epoch: int, total_steps: int) -> int:
    if warmup_epochs > 0:
        return min(total_steps, max(1, round(warmup_epochs * steps_per_epoch)))
    if kind == "onecycle":
        return max(1, round(ONECYCLE_DEFAULT_WARMUP * total_steps))
    return 0


def lr_factor(kind: str, step: int, total_steps: int, warmup: int) -> float:
    """The share of the peak lr that optimizer step ``step`` (from 0) of ``total_steps`` uses."""
    if step < warmup:
        rise = (step + 1) / warmup
        return ONECYCLE_START + (1 - ONECYCLE_START) * rise if kind == "onecycle" else rise
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    if kind == "cosine":
        return (1 + math.cos(math.pi * progress)) / 2
    if kind == "step":
        return STEP_DECAY ** min(STEP_PARTS - 1, math.floor(STEP_PARTS * progress))
    if kind == "onecycle":
        return ONECYCLE_FLOOR + (1 - ONECYCLE_FLOOR) * (1 + math.cos(math.pi * progress)) / 2
    return 1.0


class LrSchedule:
    """Sets the lr of each optimizer step from ``lr_factor``; its state (steps taken) resumes a run."""

    def __init__(self, optimizer: torch.optim.Optimizer, kind: str, *, total_steps: int, warmup: int):
        self.optimizer, self.kind = optimizer, kind
        self.total_steps, self.warmup = total_steps, warmup
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self.steps_taken = 0
        self._apply()  # before the first step, the lr shown is the one it will use
        self._hook = optimizer.register_step_pre_hook(self._before_step)

    def lr_at(self, step: int) -> list[float]:
        factor = lr_factor(self.kind, step, self.total_steps, self.warmup)
        return [base * factor for base in self.base_lrs]

    def _apply(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self.lr_at(self.steps_taken)):
            group["lr"] = lr

    def _before_step(self, optimizer, args, kwargs) -> None:
        self._apply()
        self.steps_taken += 1

    def state_dict(self) -> dict:
        return {"kind": self.kind, "steps_taken": self.steps_taken, "total_steps": self.total_steps,
                "warmup": self.warmup, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: dict) -> None:
        self.steps_taken = int(state["steps_taken"])
        self._apply()


def optimizer_steps_per_epoch(batches_per_epoch: int, accumulate_steps: int) -> int:
    """An epoch's last, shorter group of accumulated batches still ends in an optimizer step."""
    return max(1, math.ceil(batches_per_epoch / accumulate_steps))


def attach_schedule(optimizer: torch.optim.Optimizer, config: RunConfig, *, batches_per_epoch: int) -> LrSchedule:
    """The run's schedule, driving ``optimizer`` (whose lr is ``config.base_lr``) from its next step on."""
    per_epoch = optimizer_steps_per_epoch(batches_per_epoch, config.accumulate_steps)
    total = per_epoch * config.epochs
    return LrSchedule(optimizer, config.lr_schedule, total_steps=total,
                      warmup=warmup_steps(config.lr_schedule, config.warmup_epochs, per_epoch, total))


def build_optimizer(config: RunConfig, params) -> torch.optim.Optimizer:
    """The optimizer at the run's peak lr (``base_lr``: scaled by the linear rule with --scale-lr);
    ``attach_schedule`` then sets each step's lr from it."""
    lr = config.base_lr
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=config.weight_decay)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=config.weight_decay)
    return torch.optim.Adam(params, lr=lr, weight_decay=config.weight_decay)

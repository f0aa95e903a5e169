"""What a run does when its training loss stops being a finite number (``--on-nonfinite``).

    guard = NonfiniteGuard(config.on_nonfinite, strategy, scaler)
    guard.start_epoch(epoch, total_steps, optimizer)
    ... each step, once its loss is known (None on a process that computes none, a pipeline's first stages):
    guard.observe(step, loss, images)
    if steps_optimizer and guard.skips_update():   # skip: this optimizer step is dropped on every rank
        ...
    guard.check(step)                              # stop: raises TrainingDiverged on every rank at once
    extra = guard.end_epoch()                      # {"nonfinite_steps": n, "skipped_steps": n} when any
    guard.left_out_images                          # skip: images whose loss the epoch's mean leaves out

- ``stop`` (the default) fails the run: every rank raises ``TrainingDiverged`` at the same step, after one
  collective decision, so no rank is left waiting in a collective its peers never reach. Every epoch
  recorded before it stays; the reason names the epoch, the step, the learning rate and the fp16 scale.
- ``skip`` drops the optimizer update of a step whose loss is not finite (as fp16's gradient scaler drops
  steps whose gradients overflow) on every rank, and counts it. Deciding before the update needs the flag on
  the host: one read per optimizer step, which on a GPU waits for the step's queued work (the gradient
  scaler reads its own flag the same way). The epoch's training loss is the mean over the finite losses
  (``finite_loss``). Pipelines step their optimizer inside their schedule: not there.
- ``warn`` trains on and counts the steps.

The flag itself stays on the device: each step adds to a device tensor (no host read). ``stop`` and ``warn``
read it at check points only: every step on a CPU, where a read costs nothing, and every ``CUDA_CHECK_EVERY``
steps on a GPU, where the copy is started without waiting (``non_blocking`` into pinned memory) and read at
the next check point, by which time it has long landed; so a GPU never waits for the check, and a run stops
at most ``2 * CUDA_CHECK_EVERY`` steps after its loss went bad, the reason naming the step where it did.
Every rank checks at the same steps, so the collective behind each decision is entered by all.
"""

from __future__ import annotations

import math

import torch

NONE = -math.inf  # no bad step seen
# Kinds of non-finite value, in the order a tie between ranks is settled (the first wins).
KINDS = ("NaN", "+inf", "-inf")
CUDA_CHECK_EVERY = 16


def start_host_copy(tensor: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.cuda.Event]:
    """A copy of ``tensor`` (on GPU ``device``) into pinned host memory, started without waiting, and the event
    after it on ``device``'s current stream: the host reads the copy once the event has passed. Not the current
    device's stream: under model parallel that is the first stage's GPU, while the copy runs on the last's,
    and an event there could pass before the copy lands (a stale read)."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype).pin_memory()
    host.copy_(tensor, non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return host, event


class TrainingDiverged(ValueError):
    """The training loss became NaN or infinite under ``--on-nonfinite stop``: its message is the run's reason;
    ``epoch``, ``step`` and ``total_steps`` say where, for the run's progress."""

    def __init__(self, reason: str, *, epoch: int = 0, step: int = 0, total_steps: int = 0):
        super().__init__(reason)
        self.epoch, self.step, self.total_steps = epoch, step, total_steps


class NonfiniteGuard:
    """One rank's watch over its training losses; see the module's docstring."""

    def __init__(self, action: str, strategy, scaler: torch.amp.GradScaler | None = None,
                 check_every: int | None = None):
        self.action, self.strategy, self.scaler = action, strategy, scaler
        self.device = strategy.output_device
        self.on_cuda = self.device.type == "cuda"
        self.check_every = check_every or (CUDA_CHECK_EVERY if self.on_cuda else 1)
        self.told = False  # the run's webhooks were told that it trains on through non-finite losses

    def start_epoch(self, epoch: int, total_steps: int, optimizer: torch.optim.Optimizer) -> None:
        self.epoch, self.total_steps, self.optimizer = epoch, total_steps, optimizer
        # [earliest bad step as a score (larger is earlier), steps with a non-finite loss, their images]; on the device.
        self._state = torch.tensor([NONE, 0.0, 0.0], dtype=torch.float64, device=self.device)
        self._group_bad = torch.zeros((), dtype=torch.float64, device=self.device)
        self._lrs: dict[int, object] = {}
        self._in_flight = None  # (host copy of the reduced state, its CUDA event) started at the last check
        self.skipped = 0
        self.left_out_images = 0

    @property
    def drops_steps(self) -> bool:
        return self.action == "skip"

    def finite_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Under ``skip``, the loss to add to the epoch's mean: 0 for a dropped one (its images are left
        out of the mean's count, ``left_out_images``); the loss itself otherwise."""
        return torch.where(torch.isfinite(loss), loss, 0.0) if self.drops_steps else loss

    def observe(self, step: int, loss: torch.Tensor | None, images: int = 0) -> None:
        """Note this step's loss (a device tensor) over ``images`` without reading it."""
        lr = self.optimizer.param_groups[0]["lr"]
        self._lrs[step] = lr.detach().clone() if isinstance(lr, torch.Tensor) else lr
        if loss is None:
            return
        loss = loss.detach().reshape(()).to(torch.float64)
        kind = torch.where(torch.isnan(loss), 0.0, torch.where(loss > 0, 1.0, 2.0))
        bad = ~torch.isfinite(loss)
        # Score: later steps and later kinds score lower, so the maximum is the earliest bad step.
        score = torch.where(bad, -(step * len(KINDS) + kind), NONE)
        self._state[0] = torch.maximum(self._state[0], score)
        self._state[1] += bad.to(torch.float64)
        self._state[2] += bad.to(torch.float64) * images
        self._group_bad = torch.maximum(self._group_bad, bad.to(torch.float64))

    def skips_update(self) -> bool:
        """Under ``skip``: whether the optimizer step closing this group of batches is dropped, decided
        for every rank at once (a collective and a host read); False otherwise, at no cost."""
        if not self.drops_steps:
            return False
        bad = self.strategy.all_reduce(self._group_bad.clone(), "max").item() > 0
        self._group_bad.zero_()
        if bad:
            self.skipped += 1
        return bad

    def check(self, step: int) -> None:
        """At a check point (see the module's docstring), raise ``TrainingDiverged`` on every rank under
        ``stop`` when a loss seen so far was not finite."""
        if self.action != "stop":
            return
        last = step == self.total_steps
        if step % self.check_every and not last:
            return
        if not self.on_cuda:
            self._decide(self._reduced().tolist())
            return
        landed = self._in_flight
        self._in_flight = start_host_copy(self._reduced(), self.device)
        if last:  # the epoch ends here: this check's answer is read now (the epoch's end waits anyway)
            landed = self._in_flight
        if landed is not None:
            landed[1].synchronize()  # recorded a check ago: long done
            self._decide(landed[0].tolist())

    def end_epoch(self) -> dict:
        """The epoch's counts for its ``extra``, when there are any: ``nonfinite_steps`` the most steps any one
        rank saw a non-finite loss in (under DDP a NaN reaches every replica's weights through the gradients'
        all-reduce, so the ranks agree from the next step on), ``skipped_steps`` the optimizer steps dropped."""
        nonfinite = self.strategy.all_reduce(self._state[1:2].clone(), "max").item()
        if self.drops_steps:
            self.left_out_images = int(self.strategy.all_reduce(self._state[2:].clone(), "sum").item())
        extra = {}
        if nonfinite:
            extra["nonfinite_steps"] = int(nonfinite)
        if self.skipped:
            extra["skipped_steps"] = self.skipped
        return extra

    def _reduced(self) -> torch.Tensor:
        return self.strategy.all_reduce(self._state[:1].clone(), "max")

    def _decide(self, reduced: list[float]) -> None:
        score = reduced[0]
        if score == NONE:
            return
        step, kind = divmod(int(-score), len(KINDS))
        raise TrainingDiverged(self.reason(step, KINDS[kind]), epoch=self.epoch, step=step,
                               total_steps=self.total_steps)

    def reason(self, step: int, kind: str) -> str:
        lr = self._lrs.get(step)
        lr = float(lr) if lr is not None else float(self.optimizer.param_groups[0]["lr"])
        context = [f"lr {lr:g}"]
        if self.scaler is not None:
            context.append(f"fp16 scale {self.scaler.get_scale():g}")
        return (f"loss became {kind} at epoch {self.epoch} step {step} ({', '.join(context)}); the run stopped there "
                f"(--on-nonfinite stop) and keeps every epoch recorded before it: lower the learning rate, clip "
                f"gradients (--grad-clip), or use --on-nonfinite skip to drop such steps")

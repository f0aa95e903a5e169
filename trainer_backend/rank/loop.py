"""The training and evaluation loops, the same for every strategy.

    totals, train_time_s = train_one_epoch(model, train_loader, optimizer, strategy, amp_dtype=None)
    val_totals = validate(model, val_loader, strategy)

The loops run steps over a strategy (which knows the devices and collectives), with no branch on which one
it is: each step is the strategy's ``train_step`` (the default forward, backward and optimizer step, or a
pipeline schedule's) and the evaluation its ``evaluate``.
Per-batch numbers are summed on the device and read once per epoch: a ``.item()`` per step
would force a host-device sync every step and slow GPU training for a progress number.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer_backend.rank.confusion import accumulate
from trainer_backend.rank.divergence import NonfiniteGuard
from trainer_backend.rank.stopping import StopAtStep
from trainer_backend.telemetry.profiling import StepProfiler, phase_ranges
from trainer_backend.rank.strategies import Step, Strategy, synchronize

StepCallback = Callable[[int, int], None]
StartCallback = Callable[[], None]  # the epoch's first step is about to run
LossCallback = Callable[[torch.Tensor], None]  # the step's loss, still on the device


# bf16 tensor cores arrived with Ampere; before it bf16 is emulated (slower than fp32), although
# torch.cuda.is_bf16_supported() says yes.
BF16_MIN_CAPABILITY = (8, 0)


def resolve_amp(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for this run, or None for plain fp32 (always on CPU)."""
    if device.type != "cuda" or amp == "off":
        return None
    if amp == "fp16":
        return torch.float16
    if amp == "bf16" or torch.cuda.get_device_capability(device) >= BF16_MIN_CAPABILITY:
        return torch.bfloat16
    return torch.float16


def amp_setting(amp: str, capabilities: list[tuple[int, int]], *, microbatched: bool = False) -> str:
    """``amp`` as every rank of a run on GPUs of ``capabilities`` trains it: "auto" becomes "bf16"
    only where every one has bf16 tensor cores, else "fp16", or "off" for a pipeline, which cannot
    scale fp16 gradients. One answer for the whole world: DDP averages every rank's gradients, and a
    rank that scales its fp16 loss beside one that does not would make the replicas diverge."""
    if amp != "auto" or not capabilities:
        return amp
    if min(capabilities) >= BF16_MIN_CAPABILITY:
        return "bf16"
    return "off" if microbatched else "fp16"


def listed_capabilities(devices) -> list[tuple[int, int]]:
    """The compute capability of each GPU ``devices`` lists on this machine: NVML's answer where it
    gives one (it starts no CUDA context), else torch's."""
    from contract.devices import cuda_indices, gpu_statuses

    indices = cuda_indices(devices)
    if not indices:
        return []
    known = {gpu.index: gpu.compute_capability for gpu in gpu_statuses()}
    return [tuple(known.get(index) or torch.cuda.get_device_capability(index)) for index in indices]


def with_resolved_amp(config, capabilities: list[tuple[int, int]] | None = None):
    """``config`` (a RunConfig) with ``--amp auto`` resolved once for every rank, from the weakest
    of ``capabilities`` (by default those of the GPUs it lists on this machine). CPU runs keep
    "auto": they train in fp32 whatever it says."""
    from contract.strategy_specs import spec

    if config.amp != "auto" or not config.uses_cuda:
        return config
    if capabilities is None:
        if config.nodes > 1:
            return config  # other machines' GPUs cannot be asked from here: torchrun gathers them
        capabilities = listed_capabilities(config.devices)
    return config.replace(amp=amp_setting(config.amp, capabilities, microbatched=spec(config.strategy).microbatched))


def rank_amp_dtype(config, device: torch.device) -> torch.dtype | None:
    """The autocast dtype a rank of ``config`` trains in on ``device``. The launcher resolved
    ``--amp auto`` for the whole world (``with_resolved_amp``); a config that comes here unresolved
    is resolved alike, from every GPU it lists, never from this rank's GPU alone."""
    from contract.strategy_specs import spec

    amp_dtype = resolve_amp(with_resolved_amp(config).amp, device)
    if spec(config.strategy).microbatched and amp_dtype == torch.float16:
        return None  # fp16 without a gradient scaler underflows; pipelines cannot scale
    return amp_dtype


def make_grad_scaler(amp_dtype: torch.dtype | None) -> torch.amp.GradScaler | None:
    # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.
    return torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None


class PrecisionRecord:
    """What mixed precision really did, for the epoch's ``extra``: the dtype the training forward's
    output came out in (autocast is per thread, so this is observed, not assumed) and, under fp16,
    the gradient scaler's scale at the end of the epoch (it halves on every overflowing step)."""

    def __init__(self, model: nn.Module, scaler: torch.amp.GradScaler | None):
        self.scaler = scaler
        self.forward_dtype: torch.dtype | None = None
        self._hook = model.register_forward_hook(self._record)

    def _record(self, module: nn.Module, inputs, output) -> None:
        if module.training and isinstance(output, torch.Tensor):
            self.forward_dtype = output.dtype

    def extra(self) -> dict:
        record = {}
        if self.forward_dtype is not None:
            record["forward_dtype"] = str(self.forward_dtype).removeprefix("torch.")
        if self.scaler is not None:
            record["grad_scale"] = float(self.scaler.get_scale())
        return record


def validate(model: nn.Module, loader: DataLoader, strategy: Strategy, *, amp_dtype: torch.dtype | None = None,
             bn_loader: DataLoader | None = None) -> torch.Tensor:
    """[loss_sum, correct, count, confusion counts...] over this process's validation shard (see
    confusion.py): the strategy's evaluation, after its BatchNorm statistics are recomputed over
    ``bn_loader`` where one is given (batchnorm.py)."""
    return strategy.evaluate(model, loader, amp_dtype=amp_dtype, bn_loader=bn_loader)


def train_one_epoch(
    model: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    strategy: Strategy,
    *,
    amp_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    on_step: StepCallback | None = None,
    profiler: StepProfiler | None = None,
    on_loss: LossCallback | None = None,
    on_start: StartCallback | None = None,
    guard: NonfiniteGuard | None = None,
    first_step: int = 1,
    stop: Callable[[int, int], bool] | None = None,
) -> tuple[torch.Tensor, float]:
    """One pass over this process's shard (from ``first_step``, resuming an epoch stopped after the step
    before it: the batches before it are read, in the epoch's order, and not trained). Returns ([loss_sum, correct, count], seconds). Each step is
    the strategy's ``train_step``: the default forward, backward and optimizer step, or a pipeline schedule's.
    ``guard`` watches the losses for NaN and infinity (divergence.py): it may drop an optimizer step
    (skip) or end the epoch on every rank at once (stop). ``stop`` (rank/stopping.py), asked after each
    optimizer step, may end the epoch there on every rank: ``StopAtStep`` is raised. ``on_step`` follows each
    step; the epoch's last is followed once its clock has stopped."""
    model.train()
    phase = phase_ranges(profiler)
    totals = torch.zeros(3, dtype=torch.float64, device=strategy.output_device)
    total_steps = len(loader)
    batches = iter(loader)
    for _ in range(first_step - 1):
        next(batches)
    clock = strategy.rank_clock
    clock.reset()
    strategy.barrier()  # ranks start the clock together: a late starter's wait is not its peers' work
    synchronize(strategy.devices)
    start = time.perf_counter()
    if on_start is not None:
        on_start()
    accumulate_steps = strategy.config.accumulate_steps

    def stop_clock(step: int) -> float:
        """The epoch's training seconds, once its queued work is done; then the last step's ``on_step``,
        whose writes (the epoch's progress, step points and energy) are not training time."""
        synchronize(strategy.devices)
        seconds = time.perf_counter() - start
        if on_step is not None and step == total_steps >= first_step:
            on_step(step, total_steps)
        return seconds

    for step in range(first_step, total_steps + 1):
        # Batches group into optimizer steps; the epoch's last group may be shorter.
        group_start = (step - 1) // accumulate_steps * accumulate_steps
        group_size = min(accumulate_steps, total_steps - group_start)
        steps_optimizer = step == group_start + group_size
        with phase("data_loading"), clock.data():
            images, labels = strategy.to_device(*next(batches), train=True)
        # The step observes its loss with the guard, which may drop its optimizer step on every rank.
        outcome = strategy.train_step(model, images, labels, optimizer,
                                      Step(step, group_size, steps_optimizer, amp_dtype, scaler, guard, phase))
        if outcome is not None:  # None on a process that computes no loss (a pipeline's first stages)
            loss, logits, labels = outcome
            accumulate(totals, guard.finite_loss(loss) if guard is not None else loss, logits, labels)
        if guard is not None:
            guard.check(step)
        if profiler is not None:
            profiler.step()
        if on_loss is not None and outcome is not None:
            on_loss(loss)
        if on_step is not None and step < total_steps:
            on_step(step, total_steps)
        if stop is not None and steps_optimizer and stop(step, total_steps):
            raise StopAtStep(step, totals, stop_clock(step))
    return totals, stop_clock(total_steps)

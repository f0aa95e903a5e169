"""The protocol every strategy keeps, and ``single``: one device, where every collective is a no-op.

A strategy is nine methods: ``setup`` and ``teardown`` (its devices and process group), ``wrap`` (the model
placed, wrapped or cut), ``to_device`` (a batch as the model takes it), ``train_step`` and ``evaluate`` (the
default step and evaluation, which the pipeline overrides: its schedule runs each step's forward and backward
itself), ``extra_metrics`` (its own numbers per epoch), ``all_reduce`` and ``barrier``. The rest is done by
small helpers it owns, each with one job:

    group        process_group.py  LocalGroup, or the run's ProcessGroup (ddp, fsdp, pp): join, collectives, leave
    shards       data_shards.py    which data each process reads, and what a batch becomes on the replicas
    sync         replica_sync.py   gradient reduction deferred, gradient norm clipped, buffers shared
    checkpoints  checkpoints.py    the best checkpoint's state dict and the resume point's, gathered on rank 0
    memory_placement  placements.py  where the estimate before launch puts the run's memory

Also what every strategy shares: mixed precision (``autocast``), the optimizer step (``optimizer_step``)
and the sync before a wall-clock reading (``synchronize``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from contract.config import RunConfig
from contract.strategy_specs import spec
from trainer_backend.rank.batchnorm import reestimate
from trainer_backend.rank.confusion import accumulate, add_confusion, val_totals
from trainer_backend.rank.strategies import placements
from trainer_backend.rank.strategies.checkpoints import WholeModel
from trainer_backend.rank.strategies.data_shards import WholeData
from trainer_backend.rank.strategies.process_group import LocalGroup
from trainer_backend.rank.strategies.replica_sync import OneReplica, unwrap
from trainer_backend.telemetry.rank_times import RankClock, synchronize  # noqa: F401 (every strategy syncs before a clock)


def autocast(device: torch.device, amp_dtype: torch.dtype | None):
    """Mixed precision on ``device`` in ``amp_dtype``; nothing for plain fp32."""
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=amp_dtype)


@dataclass(frozen=True)
class Step:
    """What one training step needs beside its batch: its number in the epoch, its accumulation group
    (``group_size`` batches, the optimizer stepping after the last: ``steps_optimizer``), mixed precision
    (``amp_dtype``, fp16's ``scaler``), the NaN guard (divergence.py) and the profiler's phase ranges."""

    number: int
    group_size: int = 1
    steps_optimizer: bool = True
    amp_dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None
    guard: object | None = None
    phase: Callable = lambda name: contextlib.nullcontext()


class Strategy:
    """Single device, and the defaults every other strategy starts from."""

    name = "single"
    # How this strategy's time in collectives is measured (see rank_times.RankClock): "none" has none.
    comm_measure = "none"
    memory_placement = staticmethod(placements.whole_model)

    def __init__(self, config: RunConfig, rank: int = 0, *, in_chans: int = 3, store_host: str = "",
                 store_port: int = 0):
        """The strategy for ``rank``, given everything any strategy needs (the store is where distributed
        ranks meet); each takes what it uses."""
        self.config = config
        self.rank = rank
        self.is_main = rank == 0
        process_per_device = spec(self.name).distributed  # this rank's device, or the first for one process
        self.world_size = len(config.devices) if process_per_device else 1
        self.input_device = torch.device(config.devices[rank if process_per_device else 0])
        self.output_device = self.input_device
        # Every device this process computes on (for synchronised timing and memory).
        self.devices = [self.input_device]
        # The device-side batch preparation (inputs.DeviceInputs), set by the trainer once the
        # data is known; without it a batch's tensors go to the devices as they are.
        self.inputs = None
        self.group = LocalGroup()
        self.shards = WholeData()
        self.sync = OneReplica()
        self.checkpoints = WholeModel(self.is_main)
        # This process's split of each epoch's training time (data, compute, waiting in collectives).
        self.rank_clock = RankClock(self.input_device, self.comm_measure)

    def setup(self) -> None:
        if self.input_device.type == "cuda":
            torch.cuda.set_device(self.input_device)
            # Every batch has the same shape, so cuDNN's one-off search for the fastest
            # convolution algorithms pays for itself within the first epoch.
            torch.backends.cudnn.benchmark = True
        self.group.join()

    def wrap(self, model: nn.Module) -> nn.Module:
        return model.to(self.input_device)

    def to_device(self, images: torch.Tensor, labels: torch.Tensor, *, train: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """A loader's batch as the model takes it: images on the input device (normalised and,
        for training batches, augmented there), labels on the output device."""
        labels = labels.to(self.output_device, non_blocking=True)
        if self.inputs is None:
            return images.to(self.input_device, non_blocking=True), labels
        return self.inputs(images, train=train), labels

    def train_step(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                   optimizer: torch.optim.Optimizer, step: Step) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """One batch's forward and backward, and at the end of its accumulation group the optimizer step
        (dropped on every rank where the guard says so). Returns (the loss, logits, labels), or None on a
        process that computes no loss."""
        # DDP/FSDP all-reduce gradients only on a group's last backward; the others add up locally.
        with contextlib.nullcontext() if step.steps_optimizer else self.sync.no_sync(model):
            with step.phase("forward"), autocast(self.input_device, step.amp_dtype):
                logits = model(images)
                loss = F.cross_entropy(logits, labels, label_smoothing=self.config.label_smoothing)
            with step.phase("backward"), self.rank_clock.backward():
                # Summed over the group, the gradients are those of the group's mean loss: the larger batch's.
                part = loss / step.group_size if step.group_size > 1 else loss
                (step.scaler.scale(part) if step.scaler is not None else part).backward()
        if step.guard is not None:
            step.guard.observe(step.number, loss, labels.numel())
        if step.steps_optimizer:
            with step.phase("optimizer_step"):
                if step.guard is not None and step.guard.skips_update():
                    optimizer.zero_grad(set_to_none=True)  # dropped on every rank: the weights stay finite
                else:
                    optimizer_step(model, optimizer, self, step.scaler)
        return loss.detach(), logits.detach(), labels

    def evaluate(self, model: nn.Module, loader, *, amp_dtype: torch.dtype | None = None, bn_loader=None
                 ) -> torch.Tensor:
        """[loss_sum, correct, count, confusion counts...] over this process's validation shard, on the model
        without its data-parallel wrapper. First, with ``bn_loader``, its BatchNorm statistics are recomputed
        over those batches (every rank the same: batchnorm.py), and every process takes the same weights
        (``sync.sync_buffers``). The loss is the plain cross-entropy, without the training's label smoothing,
        so validation losses compare across recipes."""
        module = unwrap(model)
        if bn_loader is not None:
            def forward(images: torch.Tensor, labels: torch.Tensor) -> None:
                with autocast(self.input_device, amp_dtype):
                    module(self.to_device(images, labels)[0])

            reestimate(module, bn_loader, forward)
        self.sync.sync_buffers(model)
        module.eval()
        # Any iterable of batches will do; a DataLoader's dataset tells the classes to count a confusion matrix over.
        totals = val_totals(getattr(getattr(loader, "dataset", None), "num_classes", 0), self.output_device)
        with torch.no_grad():
            for images, labels in loader:
                images, labels = self.to_device(images, labels)
                with autocast(self.input_device, amp_dtype):
                    logits = module(images)
                    loss = F.cross_entropy(logits, labels)
                accumulate(totals, loss, logits, labels)
                add_confusion(totals, logits.argmax(dim=1), labels)
        return totals

    def extra_metrics(self, train_time_s: float) -> dict:
        """Strategy-specific numbers for the epoch that trained for ``train_time_s`` on this process (e.g. a
        pipeline's stage busy time); collective."""
        return {}

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return self.group.all_reduce(tensor, op)

    def barrier(self) -> None:
        """Wait for every process of the run."""
        self.group.barrier()

    def teardown(self) -> None:
        self.group.leave()


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, strategy: Strategy,
                   scaler: torch.amp.GradScaler | None) -> None:
    """Clip the gradients (when the run asks), step, clear the gradients. Under fp16 the gradients
    are unscaled first, so that the clipping norm is the true gradients' norm."""
    if strategy.config.grad_clip:
        if scaler is not None:
            scaler.unscale_(optimizer)
        strategy.sync.clip_grad_norm(model, strategy.config.grad_clip)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)

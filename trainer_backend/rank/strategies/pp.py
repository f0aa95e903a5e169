"""Pipeline parallel (``pp``) with ``torch.distributed.pipelining``: one process per stage.

The model is cut as for ``mp`` (consecutive layers, balanced by parameter count); each rank keeps
its stage and the schedule (GPipe or 1F1B) streams microbatches through the stages so that
several work at once. Every rank takes the same batches, in the same seeded order, but only the
first stage reads their images and only the last their labels (``feed``): the others get
placeholders that say how many images a batch has, and load, decode and crop nothing. The
pipeline's cost is the *bubble* — time a stage waits for its neighbours — recorded per epoch as
each stage's busy fraction.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from contract.config import RunConfig
from trainer_backend.rank.batchnorm import reestimate
from trainer_backend.rank.confusion import add_confusion, val_totals
from trainer_backend.rank.models import split_into_stages
from trainer_backend.rank.strategies import placements
from trainer_backend.rank.strategies.base import Step, Strategy, autocast, optimizer_step
from trainer_backend.rank.strategies.checkpoints import StageStates
from trainer_backend.rank.strategies.data_shards import StageFeed
from trainer_backend.rank.strategies.process_group import ProcessGroup
from trainer_backend.rank.strategies.replica_sync import Stages

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class StageClock:
    """The time a stage spends computing its microbatches.

    On CPU (gloo) a chunk's host time is its work: receives were waited for before it. On CUDA
    the host only enqueues a chunk, and NCCL's ``wait()`` returns at once, leaving the stream to
    wait for the neighbour's data; host clocks would count that wait as work, and a sync after
    each chunk to make them honest would serialise the pipeline. So on CUDA each chunk is
    bracketed by CUDA events on the stage's stream (the start event passes only once the
    received data is there), read back when they have completed, without stalling the host.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.busy_s = 0.0
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def reset(self) -> None:
        self.busy_s, self._pending = 0.0, []

    def timed(self, chunk):
        def run(*args, **kwargs):
            if self.device.type != "cuda":
                start = time.perf_counter()
                result = chunk(*args, **kwargs)
                self.busy_s += time.perf_counter() - start
                return result
            stream = torch.cuda.current_stream(self.device)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record(stream)
            result = chunk(*args, **kwargs)
            end.record(stream)
            self._pending.append((begin, end))
            return result
        return run

    def collect(self, wait: bool = False) -> None:
        """Add the chunks whose events have completed (all of them with ``wait``)."""
        still_running = []
        for begin, end in self._pending:
            if wait:
                end.synchronize()
            elif not end.query():
                still_running.append((begin, end))
                continue
            self.busy_s += begin.elapsed_time(end) / 1000  # milliseconds
        self._pending = still_running


class _AutocastForward(nn.Module):
    """A stage's module whose forward runs under the run's autocast dtype (read when it runs). The
    schedule runs forwards and backwards in one call; autocast around that call would cover the
    backwards too, which PyTorch's AMP notes advise against. Wrapping the module also covers the
    forwards the stage runs to infer its activations' shapes and dtypes, so the dtypes stages send
    each other are the ones they infer."""

    def __init__(self, module: nn.Module, device: torch.device, amp_dtype):
        super().__init__()
        self.module, self.device, self.amp_dtype = module, device, amp_dtype

    def forward(self, *args, **kwargs):
        with autocast(self.device, self.amp_dtype()):
            return self.module(*args, **kwargs)


def _loss(logits: torch.Tensor, labels: torch.Tensor, *, label_smoothing: float) -> torch.Tensor:
    # Outside autocast (see _AutocastForward): in fp32, as autocast itself runs cross_entropy.
    return F.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing)


class PipelineStrategy(Strategy):
    """One process per stage; its schedule runs each step's forward and backward (``train_step``) and the
    evaluation (``evaluate``), and times the stage's compute."""

    name = "pp"
    comm_measure = "stages"  # a stage's time not computing or loading is spent waiting for its neighbours
    memory_placement = staticmethod(placements.pipeline_stages)

    def __init__(self, config: RunConfig, rank: int = 0, *, in_chans: int = 3, store_host: str = "",
                 store_port: int = 0, **given):
        super().__init__(config, rank, **given)
        self.in_chans = in_chans
        self.is_first, self.is_last = rank == 0, rank == self.world_size - 1
        self.group = ProcessGroup(config, rank, self.input_device, store_host, store_port)
        self.shards = StageFeed(self.is_first, self.is_last)
        self.sync = Stages(self.group, self.output_device)
        self.checkpoints = StageStates(rank, self.world_size)
        self._clock = StageClock(self.input_device)
        self._optimizer_clock = StageClock(self.input_device)
        self._busy_s = 0.0
        self._amp_dtype = None  # the autocast dtype of the schedule's forwards, set by each step and evaluation

    def wrap(self, model: nn.Module) -> nn.Module:
        stages = split_into_stages(model, self.world_size, in_chans=self.in_chans,
                                   image_size=self.config.image_size, name=self.config.model)
        stage_module = stages[self.rank].to(self.input_device)
        names = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
        self.checkpoints.state_names = [(names[id(t)], t) for t in [*stage_module.parameters(), *stage_module.buffers()]]
        forward = _AutocastForward(stage_module, self.input_device, lambda: self._amp_dtype)
        self._stage = PipelineStage(forward, self.rank, self.world_size, self.input_device)
        self._time_compute(self._stage)
        self._schedule = SCHEDULES[self.config.pipeline_schedule](
            self._stage, n_microbatches=self.config.microbatches,
            loss_fn=functools.partial(_loss, label_smoothing=self.config.label_smoothing),
        )
        return stage_module

    def _time_compute(self, stage: PipelineStage) -> None:
        """Count the time this stage computes (forward and backward of a microbatch); the rest of
        a step it waits for its neighbours. Waits for sends and receives happen outside these."""
        for method in ("forward_one_chunk", "backward_one_chunk"):
            setattr(stage, method, self._clock.timed(getattr(stage, method)))

    def to_device(self, images: torch.Tensor, labels: torch.Tensor, *, train: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first stage's images as the model takes them, the last stage's labels on its device;
        what a stage does not use stays as the loader gave it."""
        if self.is_first:
            images = (self.inputs(images, train=train) if self.inputs is not None
                      else images.to(self.input_device, non_blocking=True))
        if self.is_last:
            labels = labels.to(self.output_device, non_blocking=True)
        return images, labels

    def _run_schedule(self, method, images: torch.Tensor, labels: torch.Tensor, losses: list | None):
        if self.is_first:
            return method(images)
        if self.is_last:
            return method(target=labels, losses=losses)
        return method()

    def train_step(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                   optimizer: torch.optim.Optimizer, step: Step) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """One batch through the schedule and the optimizer step, then its loss noted by the guard (after the
        step: the schedule cannot leave one out). Returns (the batch's loss, logits, labels) on the last stage,
        the only one that computes them, and None on the others."""
        self._amp_dtype = step.amp_dtype
        losses: list[torch.Tensor] = []
        # Forward and backward interleave inside the schedule (they show as "other"); the
        # forwards alone run under autocast (_AutocastForward).
        logits = self._run_schedule(self._schedule.step, images, labels, losses)
        with step.phase("optimizer_step"):
            # Clip (when asked), step (the lr schedule with it, schedule.py), clear: as every loop does.
            self._optimizer_clock.timed(optimizer_step)(model, optimizer, self, None)
        self._clock.collect()
        self._optimizer_clock.collect()
        # Equal microbatches (the batch divides evenly): the batch's loss is their mean.
        outcome = (torch.stack(losses).detach().double().mean(), logits, labels) if self.is_last else None
        if step.guard is not None:  # its loss, where this stage computes one, after its own optimizer step
            step.guard.observe(step.number, *((outcome[0], labels.numel()) if outcome is not None else (None,)))
        return outcome

    def evaluate(self, model: nn.Module, loader, *, amp_dtype=None, bn_loader=None) -> torch.Tensor:
        """The epoch's training compute read first (BatchNorm re-estimation and validation run the same timed
        chunks after it), then, with ``bn_loader``, each stage's BatchNorm statistics recomputed, then the
        validation batches through the forward-only schedule; the stage clocks start again for the next epoch."""
        self._clock.collect(wait=True)
        self._optimizer_clock.collect(wait=True)
        self._busy_s = self._clock.busy_s
        self.rank_clock.compute_s = self._busy_s + self._optimizer_clock.busy_s
        self._amp_dtype = amp_dtype
        if bn_loader is not None:
            self._reestimate_batchnorm(model, bn_loader)
        totals = self._validate(model, loader)
        self._clock.reset()
        self._optimizer_clock.reset()
        return totals

    @torch.no_grad()
    def _validate(self, model: nn.Module, loader) -> torch.Tensor:
        model.eval()
        totals = val_totals(getattr(loader.dataset, "num_classes", 0), self.output_device)
        batch = self.config.batch_size
        for images, labels in loader:
            real = len(labels)  # a placeholder's length too (LabelsOnly)
            # On the device first: a batch decoded there (JPEG bytes) has pixels only from then on.
            images, labels = self.to_device(images, labels)
            if real < batch and self.is_first:  # pad to the fixed microbatch shapes; the padding is not counted
                images = torch.cat([images, images.new_zeros((batch - real, *images.shape[1:]))])
            if real < batch and self.is_last:
                labels = torch.cat([labels, labels.new_zeros(batch - real)])
            logits = self._run_schedule(self._schedule.eval, images, labels, None)
            if self.is_last:
                logits, labels = logits[:real].float(), labels[:real]
                totals[0] += F.cross_entropy(logits, labels, reduction="sum").double()
                totals[1] += (logits.argmax(dim=1) == labels).sum()
                totals[2] += real
                add_confusion(totals, logits.argmax(dim=1), labels)
        return totals

    def _reestimate_batchnorm(self, model: nn.Module, loader) -> bool:
        """Each stage recomputes its own layers' statistics from the activations the forward-only
        schedule hands it; every rank takes part, BatchNorm or not, since the schedule is a collective."""

        def forward(images: torch.Tensor, labels: torch.Tensor) -> None:
            self._run_schedule(self._schedule.eval, *self.to_device(images, labels), None)

        found = reestimate(model, loader, forward)
        if not found:  # this stage has none, its neighbours may: run the same schedule steps
            model.train()
            with torch.no_grad():
                for images, labels in loader:
                    forward(images, labels)
        return bool(self.all_reduce(torch.tensor([float(found)], device=self.output_device), "max").item())

    def extra_metrics(self, train_time_s: float) -> dict:
        """Each stage's share of the training time spent computing; the rest is the bubble."""
        busy = torch.zeros(self.world_size, dtype=torch.float64, device=self.output_device)
        busy[self.rank] = self._busy_s / train_time_s if train_time_s else 0.0
        fractions = self.all_reduce(busy).tolist()
        return {
            "stage_busy_fraction": {f"stage{i}": round(f, 4) for i, f in enumerate(fractions)},
            "bubble_fraction": round(1 - sum(fractions) / len(fractions), 4),
        }


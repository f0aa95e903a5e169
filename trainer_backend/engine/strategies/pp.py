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
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from contract.config import RunConfig
from trainer_backend.datasets.labels_only import LabelsOnly
from trainer_backend.datasets.prepare import PreparedData
from trainer_backend.engine.batchnorm import reestimate
from trainer_backend.engine.confusion import add_confusion, val_totals
from trainer_backend.engine.loop import optimizer_step, train_one_epoch
from trainer_backend.engine.models import split_into_stages
from trainer_backend.engine.strategies import DistributedStrategy, autocast, on_cpu

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


class PipelineStrategy(DistributedStrategy):
    name = "pp"
    runs_own_loop = True  # the schedule runs each step's forward and backward (train_step), and evaluates
    drop_last_train = True  # microbatch shapes are fixed by the first step
    comm_measure = "stages"  # a stage's time not computing or loading is spent waiting for its neighbours

    @classmethod
    def create(cls, config: RunConfig, rank: int = 0, *, in_chans: int = 3, store_host: str = "",
               store_port: int = 0) -> PipelineStrategy:
        return cls(config, rank, store_host, store_port, in_chans=in_chans)

    def __init__(self, config: RunConfig, rank: int, store_host: str = "", store_port: int = 0, *, in_chans: int = 3):
        super().__init__(config, rank, store_host, store_port)
        self.in_chans = in_chans
        self.is_first, self.is_last = rank == 0, rank == self.world_size - 1
        self._clock = StageClock(self.input_device)
        self._optimizer_clock = StageClock(self.input_device)
        self._wall_s = self._busy_s = 0.0
        self._amp_dtype = None  # the autocast dtype of the schedule's forwards, set by each loop

    @staticmethod
    def memory_placement(plan) -> list:
        """Stage i on process i, training on microbatches: GPipe runs every microbatch's forward
        before any backward, so a stage keeps m microbatches' activations; 1F1B keeps at most
        p - i. Receive buffers are made up front, one per microbatch: the activations coming in
        (after the first stage) and their gradients coming back (before the last). The first
        stage also holds the whole batch it cuts up."""
        config = plan.config
        stages, m = config.world_size, config.microbatches
        micro = config.batch_size // m
        devices = []
        for i, label in enumerate(plan.labels()):
            device, trace = plan.stage_memory(label, i, micro, takes_input=i == 0)  # the first stage crops
            in_flight = m if config.pipeline_schedule == "gpipe" else min(m, stages - i)
            kept = max(0, trace.forward_kept - trace.input_bytes)
            device.activations += (in_flight - 1) * kept
            if i == 0:
                device.activations += (m - 1) * trace.input_bytes
            # What comes in is what the stage before sends: its output, in autocast's dtype.
            incoming = plan.trace(micro, i - 1).output_bytes if i > 0 else 0
            device.comm = m * (incoming + (trace.output_bytes if i < stages - 1 else 0))
            devices.append(device)
        return devices

    def wrap(self, model: nn.Module) -> nn.Module:
        stages = split_into_stages(model, self.world_size, in_chans=self.in_chans,
                                   image_size=self.config.image_size, name=self.config.model)
        stage_module = stages[self.rank].to(self.input_device)
        names = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
        self._state_names = [(names[id(t)], t) for t in [*stage_module.parameters(), *stage_module.buffers()]]
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

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    def feed(self, data: PreparedData) -> PreparedData:
        """The first stage reads the images (and keeps them on its GPU where they fit); every other
        stage reads the labels at most (the last stage), from the same seeded order, so each runs
        the same steps."""
        if self.is_first:
            return data
        return PreparedData(LabelsOnly.of(data.train, labels=self.is_last),
                            LabelsOnly.of(data.val, labels=self.is_last), data.info)

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

    def train_sampler(self, dataset_len: int, seed: int) -> None:
        return None  # the same seeded shuffle on every rank: all stages see the same batch

    def val_indices(self, dataset_len: int) -> None:
        return None

    def sync_buffers(self, model: nn.Module) -> None:
        pass  # each stage owns its layers' buffers outright

    def _run_schedule(self, method, images: torch.Tensor, labels: torch.Tensor, losses: list | None):
        if self.is_first:
            return method(images)
        if self.is_last:
            return method(target=labels, losses=losses)
        return method()

    def train_epoch(self, model, loader, optimizer, *, amp_dtype=None, **kwargs):
        """The shared epoch loop (``loop.train_one_epoch``, which asks ``train_step`` for each step),
        with the stages' compute timed around it."""
        self._amp_dtype = amp_dtype
        self._clock.reset()
        self._optimizer_clock.reset()
        totals, self._wall_s = train_one_epoch(model, loader, optimizer, self, amp_dtype=amp_dtype, **kwargs)
        self._clock.collect(wait=True)
        self._optimizer_clock.collect(wait=True)
        # Read now: validation and BatchNorm re-estimation run the same timed chunks after this.
        self._busy_s = self._clock.busy_s
        self.rank_clock.compute_s = self._busy_s + self._optimizer_clock.busy_s
        return totals, self._wall_s

    def train_step(self, model, images, labels, optimizer, phase):
        """One batch through the schedule and the optimizer step. Returns (the batch's loss, logits,
        labels) on the last stage, the only one that computes them, and None on the others."""
        losses: list[torch.Tensor] = []
        # Forward and backward interleave inside the schedule (they show as "other"); the
        # forwards alone run under autocast (_AutocastForward).
        logits = self._run_schedule(self._schedule.step, images, labels, losses)
        with phase("optimizer_step"):
            # Clip (when asked), step (the lr schedule with it, schedule.py), clear: as every loop does.
            self._optimizer_clock.timed(optimizer_step)(model, optimizer, self, None)
        self._clock.collect()
        self._optimizer_clock.collect()
        if not self.is_last:
            return None
        # Equal microbatches (the batch divides evenly): the batch's loss is their mean.
        return torch.stack(losses).detach().double().mean(), logits, labels

    @torch.no_grad()
    def evaluate(self, model, loader, *, amp_dtype=None) -> torch.Tensor:
        model.eval()
        self._amp_dtype = amp_dtype
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

    def reestimate_batchnorm(self, model, loader, *, amp_dtype=None) -> bool:
        """Each stage recomputes its own layers' statistics from the activations the forward-only
        schedule hands it; every rank takes part, BatchNorm or not, since the schedule is a collective."""

        self._amp_dtype = amp_dtype

        def forward(images: torch.Tensor, labels: torch.Tensor) -> None:
            self._run_schedule(self._schedule.eval, *self.to_device(images, labels), None)

        found = reestimate(model, loader, forward)
        if not found:  # this stage has none, its neighbours may: run the same schedule steps
            model.train()
            with torch.no_grad():
                for images, labels in loader:
                    forward(images, labels)
        return bool(self.all_reduce(torch.tensor([float(found)], device=self.output_device), "max").item())

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """Each stage holds some of the gradients: the global norm adds every stage's squares."""
        params = [p for p in model.parameters() if p.grad is not None]
        local = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.zeros(())
        squares = (local.double() ** 2).reshape(1).to(self.output_device)
        total = self.all_reduce(squares).sqrt()[0].float()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total

    def extra_metrics(self) -> dict:
        """Each stage's share of the training time spent computing; the rest is the bubble."""
        busy = torch.zeros(self.world_size, dtype=torch.float64, device=self.output_device)
        busy[self.rank] = self._busy_s / self._wall_s if self._wall_s else 0.0
        fractions = self.all_reduce(busy).tolist()
        return {
            "stage_busy_fraction": {f"stage{i}": round(f, 4) for i, f in enumerate(fractions)},
            "bubble_fraction": round(1 - sum(fractions) / len(fractions), 4),
        }

    def resume_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
        """Every stage's module and optimizer state, gathered on rank 0 as a list by stage."""
        local = on_cpu({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
        gathered: list[dict] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(local, gathered, dst=0)
        return {"stages": gathered} if self.is_main else None

    def load_resume_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        if len(state["stages"]) != self.world_size:
            raise ValueError(f"the checkpoint holds {len(state['stages'])} pipeline stages and this world has "
                             f"{self.world_size} processes: a pipeline resumes only on as many processes as it had")
        own = state["stages"][self.rank]
        model.load_state_dict(own["model"])
        optimizer.load_state_dict(own["optimizer"])

    def checkpoint_state(self, model: nn.Module) -> dict[str, torch.Tensor] | None:
        """Gather every stage's tensors, under timm's names, on rank 0."""
        local = {name: tensor.detach().cpu() for name, tensor in self._state_names}
        gathered: list[dict] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(local, gathered, dst=0)
        if not self.is_main:
            return None
        state: dict[str, torch.Tensor] = {}
        for part in gathered:
            state.update(part)
        return state

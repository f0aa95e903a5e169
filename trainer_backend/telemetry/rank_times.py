"""Where each rank's training time goes, and which ranks straggle.

Per epoch every rank splits its training time into waiting for data, waiting in collectives, and
computing (the rest: forward, backward, optimizer step):

    clock = RankClock(device, comm="hook")      # the strategy owns one
    model.register_comm_hook(None, clock.allreduce_hook)   # DDP: marks when backward's compute ends
    clock.watch_forward_sync(model)                        # DDP: its buffer broadcast before forward
    clock.watch_fsdp(model, sharded_modules)               # FSDP: its gathers and reduce-scatters
    with clock.data(): images, labels = next(batches)
    with clock.backward(): loss.backward()      # returns once the gradients' reduction is done
    clock.epoch_times(train_time_s) -> {"train_time_s", "data_time_s", "compute_time_s", "comm_wait_s"}

DDP's comm wait is the time ``backward()`` blocks after its last gradient bucket was ready (DDP
overlaps the all-reduce with the rest of backward, and what is left once the compute is done is
the wait), plus its pre-forward, where rank 0's buffers are broadcast (``watch_forward_sync``).

FSDP's is the time spent in FSDP's own hooks, which is where its compute waits on collectives:
each sharded module's pre-forward and pre-backward (the module's parameters are all-gathered and
the compute waits for them), its post-backward (its gradients' reduce-scatter starts, after the
previous one's buffer is free) and the end of backward (waiting for the last reduce-scatters).
The hooks are bracketed by hooks of our own on either side of FSDP's (``watch_fsdp``). The
intervals hold FSDP's copies of the parameters and gradients into and out of the collectives'
buffers too: a small share next to the collectives, and work done only to communicate.

On CPU (gloo) host clocks measure the waits: the host is the device, and gloo's collectives
block it. On CUDA the host only enqueues work, so the wait is read from CUDA events on the
compute stream, one at each end of the interval, whose gap is the stream stalled on NCCL; they are
read once they have completed (at the end of a step if they have, else when the epoch ends),
without stalling the host.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time

import torch
from torch import nn
from torch.autograd import Variable
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


def synchronize(devices: list[torch.device]) -> None:
    """Wait for queued GPU work so that wall-clock timings measure the work, not its launch."""
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


RANK_FIELDS = ("train_time_s", "data_time_s", "compute_time_s", "comm_wait_s")
STRAGGLER_THRESHOLD = 0.10
STRAGGLER_EPOCHS = 2


class RankClock:
    """One rank's time split for the current epoch.

    ``comm`` says how the rank's collectives are measured: "none" (no collectives: the wait is 0),
    "hook" (DDP's comm hook or FSDP's hooks, above), "stages" (a pipeline stage: ``compute_s`` is
    set from its stage clock and the rest of the step is waiting for its neighbours), or
    "unmeasured" (the wait is inside calls we cannot split, e.g. DataParallel's scatter and gather
    inside its forward: reported as None)."""

    def __init__(self, device: torch.device, comm: str = "none"):
        self.device, self.comm = device, comm
        self.reset()

    def reset(self) -> None:
        self.data_s = self.comm_wait_s = 0.0
        self.compute_s: float | None = None
        self._ready = self._forward_start = self._wait_start = None
        self._end_callback_queued = False
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def data(self):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.data_s += time.perf_counter() - start

    @contextlib.contextmanager
    def backward(self):
        self._ready = None
        yield
        if self._ready is not None:  # else no all-reduce this step (accumulating under no_sync)
            self._add_interval(self._ready, self._instant())
        self._ready = None
        self._read_completed()

    def allreduce_hook(self, state, bucket):
        """DDP's default all-reduce (mean over ranks), noting when each bucket is ready: the last
        one of a step is the end of backward's compute. (Unannotated: DDP checks annotations
        against its classes, and this module's are strings.) Only the step's last bucket is noted:
        the earlier ones would each cost a timestamp (a CUDA event on GPUs) that the next overwrites."""
        if bucket.is_last():
            self.bucket_ready()
        return default_hooks.allreduce_hook(state, bucket)

    def bucket_ready(self) -> None:
        """A gradient bucket is computed and its all-reduce starts; the last one of a step marks
        where backward's compute ended and its wait began."""
        self._ready = self._instant()

    def watch_forward_sync(self, ddp: nn.Module) -> None:
        """Count DDP's pre-forward, where it broadcasts rank 0's buffers (BatchNorm statistics) and
        waits for every rank: the gap between its own forward pre-hook and its module's."""
        ddp.register_forward_pre_hook(lambda module, args: setattr(self, "_forward_start", self._instant()))
        ddp.module.register_forward_pre_hook(lambda module, args: self._forward_synced())

    def _forward_synced(self) -> None:
        if self._forward_start is not None:
            self._add_interval(self._forward_start, self._instant())
        self._forward_start = None

    def watch_fsdp(self, root: nn.Module, sharded: list[nn.Module]) -> None:
        """Count the time in FSDP's hooks on each of the ``sharded`` modules (``root`` among them):
        a hook of ours runs just before FSDP's and one just after, in forward (its pre-forward
        hook), in backward before the module (FSDP's pre-backward hook on the module's outputs) and
        after it (FSDP's post-backward function on the module's inputs); and from the end of
        backward's graph (a callback queued ahead of FSDP's final one) to ``backward()``'s return.
        Call it after ``fully_shard``, so that ours wrap FSDP's. Training steps only: an
        evaluation's gathers are not in the training time."""
        def pre_forward_begins(module, args):
            if _counted(module):
                self._wait_begins()
                return _marked(self._wait_ends, args)  # backward reaches it after FSDP's post-backward

        def pre_forward_ends(module, args):
            if _counted(module):
                self._wait_ends()
                return _marked(self._wait_begins, args)  # backward reaches it before FSDP's post-backward

        def forward_begins(module, args, output):
            if _counted(module):
                _on_grads(output, self._backward_wait_begins)  # before FSDP's pre-backward hook

        def forward_ends(module, args, output):
            if _counted(module):
                _on_grads(output, self._wait_ends)  # after it

        for module in dict.fromkeys([*sharded, root]):
            module.register_forward_pre_hook(pre_forward_begins, prepend=True)
            module.register_forward_pre_hook(pre_forward_ends)
            module.register_forward_hook(forward_begins, prepend=True)
            module.register_forward_hook(forward_ends)

    def _backward_wait_begins(self) -> None:
        """Before a pre-backward hook of FSDP's; the first of a backward also queues the mark of
        the graph's end ahead of FSDP's final callback (queued by FSDP's first pre-backward), which
        waits for the reduce-scatters still running."""
        if not self._end_callback_queued:
            self._end_callback_queued = True
            Variable._execution_engine.queue_callback(self._graph_done)
        self._wait_begins()

    def _graph_done(self) -> None:
        self._end_callback_queued = False
        self.bucket_ready()  # the rest of backward() is FSDP's final wait, as for DDP's last bucket

    def _wait_begins(self) -> None:
        self._wait_start = self._instant()

    def _wait_ends(self) -> None:
        if self._wait_start is not None:
            self._add_interval(self._wait_start, self._instant())
        self._wait_start = None

    def _instant(self):
        """Now: a host clock on CPU, an event on the compute stream on CUDA."""
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _add_interval(self, start, end) -> None:
        if self.device.type == "cuda":
            self._pending.append((start, end))  # read at the epoch's end, without stalling the host
        else:
            self.comm_wait_s += max(0.0, end - start)

    def _read_completed(self) -> None:
        """Add up the CUDA intervals whose events the stream has passed (in the order recorded, on
        one stream), so that a long epoch does not hold thousands of events; no host sync."""
        done = 0
        for ready, end in self._pending:
            if not end.query():
                break
            self.comm_wait_s += max(0.0, ready.elapsed_time(end) / 1000)  # milliseconds
            done += 1
        del self._pending[:done]

    def epoch_times(self, train_time_s: float) -> dict[str, float | None]:
        """This rank's split of ``train_time_s`` (its own, synchronised, training time)."""
        for ready, end in self._pending:
            end.synchronize()
            self.comm_wait_s += max(0.0, ready.elapsed_time(end) / 1000)  # milliseconds
        self._pending = []
        data_s = min(self.data_s, train_time_s)
        if self.comm == "stages" and self.compute_s is not None:
            compute_s = min(self.compute_s, train_time_s - data_s)
            comm_s: float | None = train_time_s - data_s - compute_s
        elif self.comm == "hook":
            comm_s = min(self.comm_wait_s, train_time_s - data_s)
            compute_s = train_time_s - data_s - comm_s
        else:
            comm_s = 0.0 if self.comm == "none" else None
            compute_s = train_time_s - data_s
        return {"train_time_s": train_time_s, "data_time_s": data_s, "compute_time_s": compute_s, "comm_wait_s": comm_s}


def _counted(module: nn.Module) -> bool:
    return module.training and torch.is_grad_enabled()


class _Mark(torch.autograd.Function):
    """The identity on a module's inputs, whose backward calls ``mark``: placed on either side of
    FSDP's post-backward function (on the same inputs), it brackets that function's backward."""

    @staticmethod
    def forward(ctx, mark, *tensors):
        ctx.mark = mark
        return tensors if len(tensors) > 1 else tensors[0]

    @staticmethod
    def backward(ctx, *grads):
        ctx.mark()
        return (None, *grads)


def _marked(mark, args: tuple):
    """``args`` with its gradient-requiring tensors passed through ``_Mark`` (None: unchanged)."""
    at = [i for i, arg in enumerate(args) if isinstance(arg, torch.Tensor) and arg.requires_grad]
    if not at:
        return None
    marked = _Mark.apply(mark, *(args[i] for i in at))
    marked = marked if len(at) > 1 else (marked,)
    args = list(args)
    for i, tensor in zip(at, marked):
        args[i] = tensor
    return tuple(args)


def _on_grads(output, mark) -> None:
    """Call ``mark`` when a gradient of ``output``'s tensors arrives (FSDP hooks the same ones)."""
    tensors = [output] if isinstance(output, torch.Tensor) else [
        t for t in (output if isinstance(output, (tuple, list)) else ()) if isinstance(t, torch.Tensor)]
    for tensor in tensors:
        if tensor.requires_grad:
            tensor.register_hook(lambda grad: mark())


def gather_rank_times(strategy, local: dict[str, float | None]) -> list[dict]:
    """Every rank's ``local`` times on every rank, in one all-reduce of a [world, 4] tensor
    (None travels as NaN)."""
    world = strategy.world_size
    slots = torch.zeros(world, len(RANK_FIELDS), dtype=torch.float64, device=strategy.output_device)
    slots[strategy.rank] = torch.tensor([math.nan if local[f] is None else local[f] for f in RANK_FIELDS],
                                        dtype=torch.float64)
    rows = strategy.all_reduce(slots).tolist() if world > 1 else slots.tolist()
    return [{"rank": r, **{f: (None if math.isnan(v) else round(v, 4)) for f, v in zip(RANK_FIELDS, row)}}
            for r, row in enumerate(rows)]


def own_work_s(entry: dict) -> float:
    """A rank's time on its own work. Synchronous collectives make every rank's wall time the
    slowest's (the fast ones wait for it), so the time waiting in them is taken out."""
    return entry["train_time_s"] - (entry["comm_wait_s"] or 0.0)


def slow_ranks(ranks: list[dict], threshold: float = STRAGGLER_THRESHOLD) -> set[int]:
    """Ranks whose own work took ``threshold`` (10 %) or more longer than the median rank's."""
    if len(ranks) < 2:
        return set()
    median = statistics.median(own_work_s(r) for r in ranks)
    return {r["rank"] for r in ranks if median > 0 and own_work_s(r) >= (1 + threshold) * median}


def find_stragglers(history: list[list[dict]], epochs: int = STRAGGLER_EPOCHS,
                    threshold: float = STRAGGLER_THRESHOLD) -> list[int]:
    """Ranks slow (``slow_ranks``) in each of the last ``epochs`` epochs of ``history``
    (a list of each epoch's ``ranks``), in rank order."""
    if len(history) < epochs:
        return []
    slow = set.intersection(*(slow_ranks(ranks, threshold) for ranks in history[-epochs:]))
    return sorted(slow)


def straggler_note(rank: int, ranks: list[dict], epoch: int) -> str:
    """The run note naming ``rank`` a straggler, with its figures from epoch ``epoch``'s ``ranks``."""
    median = statistics.median(own_work_s(r) for r in ranks)
    mine = next(own_work_s(r) for r in ranks if r["rank"] == rank)
    return (f"Rank {rank} is a straggler: its own work (training time less time waiting in collectives) took "
            f"{mine:.2f} s in epoch {epoch}, {mine / median - 1:.0%} more than the median rank's "
            f"{median:.2f} s, and it was {STRAGGLER_THRESHOLD:.0%} or more slower in {STRAGGLER_EPOCHS} epochs running.")

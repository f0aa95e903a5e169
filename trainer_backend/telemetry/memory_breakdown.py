"""What each device's memory holds: parameters, gradients, optimizer state, the dataset kept there, and the rest.

    held = HeldMemory(model, optimizer, strategy.devices)   # counts the tensors once, right after the first optimizer step
    held.hold_data([data.train.pool_images, data.train.labels, ...])   # a dataset kept on the device (trainer.keep_on_device)
    breakdown = memory_breakdown(strategy, held.mb, peak_memory_mb(strategy.devices))   # collective

Bytes are exact: the tensors themselves, each storage counted once, and for sharded (DTensor)
parameters, gradients and optimizer state only the local shard this rank holds. They are counted
after the first optimizer step, when the gradients and the optimizer's state both exist (the
next ``zero_grad`` frees the gradients). The dataset a CUDA run keeps on its GPU is counted as its
own part, as the memory estimate counts it. "Activations and other" is the epoch's peak allocated
memory less those four: activations kept for backward, DDP's gradient buckets, FSDP's gathered
parameters, workspaces. CUDA's allocator keeps that peak (``max_memory_allocated``); the CPU's
does not, and a process's resident set also holds the interpreter, libraries and freed-but-cached
pages, so on CPU that figure is None rather than a number that would mislead.
"""

from __future__ import annotations

import math
import resource
from collections.abc import Iterable

import torch
from torch import nn

MB = 2**20
FIELDS = ("parameters_mb", "gradients_mb", "optimizer_mb", "data_mb", "activations_other_mb")
CPU_ACTIVATIONS_NOTE = ("The memory breakdown on CPU has no activations figure: the CPU allocator keeps no peak of "
                        "live tensors, and the process's resident memory also holds the interpreter and libraries.")


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The part of ``tensor`` this process holds: its shard when it is a DTensor (FSDP2)."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def device_label(device: torch.device) -> str:
    """The device as ``peak_memory_mb`` names it in one process: "cpu", "cuda:0"."""
    return "cpu" if device.type == "cpu" else str(device)


def bytes_by_device(tensors: Iterable[torch.Tensor], seen: set) -> dict[str, int]:
    """Bytes of ``tensors`` by device label, each storage once (``seen`` is shared across calls so
    a tensor counted as a parameter is not counted again elsewhere)."""
    totals: dict[str, int] = {}
    for tensor in tensors:
        tensor = local_tensor(tensor)
        if tensor.device.type == "meta":
            continue
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if key in seen or storage.nbytes() == 0:
            continue
        seen.add(key)
        label = device_label(tensor.device)
        totals[label] = totals.get(label, 0) + storage.nbytes()
    return totals


def held_mb(model: nn.Module, optimizer: torch.optim.Optimizer, devices: list[torch.device],
            data: Iterable[torch.Tensor] = ()) -> dict[str, list[float]]:
    """{device label: [parameters, gradients, optimizer state, dataset] in MB} of what ``model``,
    ``optimizer`` and the kept dataset's tensors (``data``) hold on ``devices`` (this process's)
    now. Elsewhere is not counted: Adam keeps its step counts on the host even when the parameters
    are on a GPU, and a dataset read from host memory is not on the device."""
    seen: set = set()
    params = list(model.parameters())
    parts = [
        bytes_by_device(params, seen),
        bytes_by_device((p.grad for p in params if p.grad is not None), seen),
        bytes_by_device((v for state in optimizer.state.values() for v in state.values()
                         if isinstance(v, torch.Tensor)), seen),
        bytes_by_device(data, seen),
    ]
    labels = dict.fromkeys(device_label(d) for d in devices)
    return {label: [part.get(label, 0) / MB for part in parts] for label in labels}


class HeldMemory:
    """Counts what the model and optimizer hold right after the first optimizer step (a step
    post-hook, so no training loop needs to know), then removes its hook."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, devices: list[torch.device]):
        self.model, self.devices = model, devices
        self.data: list[torch.Tensor] = []
        self.mb: dict[str, list[float]] = {}
        self._hook = optimizer.register_step_post_hook(self._count)

    def hold_data(self, tensors: Iterable[torch.Tensor]) -> None:
        """The tensors of the dataset kept on the device, counted with the rest at the first step."""
        self.data = list(tensors)

    def _count(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        self.mb = held_mb(self.model, optimizer, self.devices, self.data)
        self._hook.remove()


def local_breakdown(held: dict[str, list[float]], peaks_mb: dict[str, float]) -> dict[str, dict]:
    """This process's breakdown by device label; the rest is the device's peak less what is held
    (None where the device keeps no peak of live tensors: the CPU)."""
    breakdown = {}
    for label, (params, grads, optim, data) in held.items():
        rest = None
        if label != "cpu" and label in peaks_mb:
            rest = max(0.0, peaks_mb[label] - params - grads - optim - data)
        breakdown[label] = dict(zip(FIELDS, (params, grads, optim, data, rest)))
    return breakdown


def rank_device_label(strategy, rank: int, kind: str) -> str:
    """How the peak memory chart names rank ``rank``'s device when a run has several processes:
    "rank1:cpu", "cuda:1", and across machines (each with its own cuda:0) "rank1:cuda:0"."""
    devices = strategy.config.devices
    if kind == "cpu":
        return f"rank{rank}:cpu"
    if strategy.config.nodes > 1:
        return f"rank{rank}:{devices[rank]}"
    return f"cuda:{devices[rank].split(':')[1]}"


def memory_breakdown(strategy, held: dict[str, list[float]], peaks_mb: dict[str, float]) -> dict[str, dict]:
    """Every device's breakdown, labelled as the peak memory chart labels them; with several
    processes (one device each) gathered in one all-reduce. Collective: every rank calls it."""
    local = local_breakdown(held, peaks_mb)
    if strategy.world_size == 1:
        return {label: _rounded(entry) for label, entry in local.items()}
    kind = strategy.input_device.type
    entry = local.get(device_label(strategy.input_device), dict.fromkeys(FIELDS, 0.0))
    slots = torch.zeros(strategy.world_size, len(FIELDS), dtype=torch.float64, device=strategy.output_device)
    slots[strategy.rank] = torch.tensor([math.nan if entry[f] is None else entry[f] for f in FIELDS],
                                        dtype=torch.float64)
    rows = strategy.all_reduce(slots).tolist()
    return {rank_device_label(strategy, r, kind): _rounded(dict(zip(FIELDS, (None if math.isnan(v) else v for v in row))))
            for r, row in enumerate(rows)}


def _rounded(entry: dict) -> dict:
    return {k: (None if v is None else round(v, 3)) for k, v in entry.items()}


def reset_peak_memory(devices: list[torch.device]) -> None:
    for device in devices:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(devices: list[torch.device]) -> dict[str, float]:
    """Peak memory this epoch per CUDA device; for CPU, the process's peak resident set
    (a lifetime peak: the OS keeps no per-epoch figure)."""
    peaks: dict[str, float] = {}
    for device in devices:
        if device.type == "cuda":
            peaks[str(device)] = torch.cuda.max_memory_allocated(device) / 2**20
        else:
            # ru_maxrss is in KiB on Linux.
            peaks["cpu"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return peaks


def peak_memory_reserved_mb(devices: list[torch.device]) -> dict[str, float]:
    """Peak memory PyTorch's caching allocator held this epoch per CUDA device ({} on CPU):
    allocated counts live tensors only; reserved adds the cached blocks, and is closer to what
    nvidia-smi shows and to what decides an out-of-memory error."""
    return {str(d): torch.cuda.max_memory_reserved(d) / 2**20 for d in devices if d.type == "cuda"}

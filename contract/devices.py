"""The devices this machine can train on: GPUs as NVML sees them (name, memory, live utilisation)
and the CPU cores training processes share.

    for gpu in gpu_statuses():           # [] on a machine without an NVIDIA driver
        print(gpu.index, gpu.name, gpu.memory_total_mb, gpu.utilization_pct)

Imports neither torch nor streamlit: the dashboard polls it every few seconds, and asking torch
would create a CUDA context in the dashboard's own process.

``cuda:N`` must name the same physical GPU in the picker, the queue and the training processes.
CUDA numbers GPUs fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML (and nvidia-smi) by
PCI bus; so every Parallax process pins CUDA to the PCI bus order before CUDA starts
(``pin_cuda_device_order``), and the picker resolves ``CUDA_VISIBLE_DEVICES`` (indices, GPU
UUIDs or MIG ids) against the GPUs in that same order.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

DEVICE_ORDER = "PCI_BUS_ID"


def pin_cuda_device_order(environ=os.environ) -> None:
    """Make CUDA number GPUs by PCI bus, as NVML and nvidia-smi do. Must run before CUDA
    initialises in this process; processes it starts inherit it."""
    environ["CUDA_DEVICE_ORDER"] = DEVICE_ORDER


@dataclass(frozen=True)
class GpuStatus:
    """One GPU, indexed as torch sees it (``cuda:<index>``)."""

    index: int
    name: str
    memory_total_mb: float
    memory_used_mb: float
    utilization_pct: float | None  # None where the driver does not report it
    uuid: str = ""  # NVML's GPU-… or MIG-… id: the same physical device whatever the numbering
    compute_capability: tuple[int, int] | None = None  # CUDA's (major, minor); None where NVML does not say


def cpu_cores() -> int:
    """Cores this process may run on (what DDP's CPU processes share)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def visible_device_ids(gpu_uuids: list[str], cuda_visible_devices: str | None) -> list[str]:
    """The ids of the devices torch numbers cuda:0, cuda:1, ... in order.

    ``gpu_uuids`` are the GPUs' UUIDs in PCI bus order (CUDA's order under PCI_BUS_ID). Entries of
    CUDA_VISIBLE_DEVICES are indices into that order, GPU UUIDs or unique prefixes of them
    ("GPU-3f2a"), or MIG ids (passed through, for NVML to look up); like CUDA, the list ends at the
    first entry that names no device or names one again.
    """
    if cuda_visible_devices is None:
        return list(gpu_uuids)
    visible: list[str] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        match = None
        if entry.isdigit():
            match = gpu_uuids[int(entry)] if int(entry) < len(gpu_uuids) else None
        elif entry.startswith("GPU-"):
            candidates = [u for u in gpu_uuids if u.lower().startswith(entry.lower())]
            match = candidates[0] if len(candidates) == 1 else None
        elif entry.startswith("MIG-"):
            match = entry
        if match is None or match in visible:
            break
        visible.append(match)
    return visible


def gpu_statuses() -> list[GpuStatus]:
    """Every GPU torch can use, with its current memory use and utilisation; [] without NVML."""
    pynvml = _init_nvml()
    if pynvml is None:  # no package, no driver or no GPU: a CPU machine
        return []
    try:
        statuses = []
        for torch_index, device_id in enumerate(_visible_ids(pynvml)):
            try:
                handle = _handle_for(pynvml, device_id)
            except pynvml.NVMLError:  # a MIG id NVML does not know: CUDA stops there too
                break
            statuses.append(_read_gpu(pynvml, torch_index, handle, device_id))
        return statuses
    except pynvml.NVMLError:
        return []
    finally:
        close_nvml(pynvml)


def visible_gpu_count() -> int | None:
    """How many GPUs CUDA numbers here (cuda:0 ... cuda:N-1), from NVML: the same order and CUDA_VISIBLE_DEVICES
    resolution as ``gpu_statuses``, without a CUDA context or torch; None where NVML cannot be read (no package
    or no driver)."""
    pynvml = _init_nvml()
    if pynvml is None:
        return None
    try:
        count = 0
        for device_id in _visible_ids(pynvml):
            _handle_for(pynvml, device_id)  # a MIG id NVML does not know: CUDA stops there too
            count += 1
        return count
    except pynvml.NVMLError:
        return count
    finally:
        close_nvml(pynvml)


def gpu_free_bytes() -> dict[str, int]:
    """Each GPU's free memory now by "cuda:N", as NVML reads it (total less every process's use); {} without NVML."""
    return {f"cuda:{g.index}": int(max(0.0, g.memory_total_mb - g.memory_used_mb) * 2**20) for g in gpu_statuses()}


def _init_nvml():
    """pynvml, initialised (``close_nvml`` shuts it down), or None without the package or a driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    return pynvml


def _visible_ids(pynvml) -> list[str]:
    """The ids (GPU or MIG) of the devices torch numbers cuda:0, cuda:1, ...: NVML's GPUs in PCI bus
    order (CUDA_DEVICE_ORDER=PCI_BUS_ID, which every Parallax process sets), as CUDA_VISIBLE_DEVICES
    selects them."""
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    handles.sort(key=lambda h: _text(pynvml.nvmlDeviceGetPciInfo(h).busId).lower())
    return visible_device_ids([_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles],
                              os.environ.get("CUDA_VISIBLE_DEVICES"))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _handle_for(pynvml, device_id: str):
    """NVML's handle for a GPU UUID, a MIG UUID ("MIG-<uuid>") or a MIG id of the older form
    "MIG-GPU-<gpu uuid>/<GPU instance>/<compute instance>"."""
    if not device_id.startswith("MIG-GPU-"):
        return pynvml.nvmlDeviceGetHandleByUUID(device_id)
    gpu_uuid, gpu_instance, compute_instance = device_id[len("MIG-"):].split("/")
    parent = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
    for i in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i)
        except pynvml.NVMLError:  # an empty slot
            continue
        if (str(pynvml.nvmlDeviceGetGpuInstanceId(mig)), str(pynvml.nvmlDeviceGetComputeInstanceId(mig))) == \
                (gpu_instance, compute_instance):
            return mig
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)


def _read_gpu(pynvml, torch_index: int, handle, device_id: str) -> GpuStatus:
    name = pynvml.nvmlDeviceGetName(handle)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        utilization_pct = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except pynvml.NVMLError:  # e.g. MIG instances do not report utilisation
        utilization_pct = None
    compute_capability = None
    try:
        compute_capability = tuple(int(v) for v in pynvml.nvmlDeviceGetCudaComputeCapability(handle))
    except pynvml.NVMLError:
        with contextlib.suppress(pynvml.NVMLError):  # a MIG instance: its GPU's
            parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
            compute_capability = tuple(int(v) for v in pynvml.nvmlDeviceGetCudaComputeCapability(parent))
    return GpuStatus(
        index=torch_index,
        name=_text(name),
        memory_total_mb=memory.total / 2**20,
        memory_used_mb=memory.used / 2**20,
        utilization_pct=utilization_pct,
        uuid=device_id,
        compute_capability=compute_capability,
    )


def cuda_indices(devices) -> list[int]:
    """The ``cuda:N`` indices among a run's device names (``cuda`` alone is cuda:0)."""
    return [int(d.split(":")[1]) if ":" in d else 0 for d in devices if str(d).startswith("cuda")]


def nvml_handles(pynvml, indices: list[int]) -> dict[int, object]:
    """NVML's handles of the GPUs torch numbers ``cuda:<index>``, for the indices it can find
    (after ``nvmlInit``): the same PCI order and CUDA_VISIBLE_DEVICES resolution as ``gpu_statuses``."""
    ids = _visible_ids(pynvml)
    found = {}
    for index in indices:
        if index < len(ids):
            try:
                found[index] = _handle_for(pynvml, ids[index])
            except pynvml.NVMLError:
                continue
    return found


def open_nvml(indices: list[int]):
    """(pynvml, {index: handle}) for the run's GPUs, NVML initialised (the caller shuts it down);
    (None, {}) where there is no NVML (no package, no driver) or no GPU to watch."""
    pynvml = _init_nvml() if indices else None
    if pynvml is None:
        return None, {}
    try:
        return pynvml, nvml_handles(pynvml, indices)
    except pynvml.NVMLError:
        close_nvml(pynvml)
        return None, {}


def close_nvml(pynvml) -> None:
    if pynvml is None:
        return
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pass

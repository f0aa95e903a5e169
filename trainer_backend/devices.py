"""The devices this machine can train on: GPUs as NVML sees them (name, memory, live utilisation)
and the CPU cores worker processes share.

    for gpu in gpu_statuses():           # [] on a machine without an NVIDIA driver
        print(gpu.index, gpu.name, gpu.memory_total_mb, gpu.utilization_pct)

Imports neither torch nor streamlit: the dashboard polls it every few seconds, and asking torch
would create a CUDA context in the dashboard's own process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuStatus:
    """One GPU, indexed as torch sees it (``cuda:<index>``)."""

    index: int
    name: str
    memory_total_mb: float
    memory_used_mb: float
    utilization_pct: float | None  # None where the driver does not report it


def cpu_cores() -> int:
    """Cores this process may run on (what DDP's CPU processes share)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def visible_nvml_indices(nvml_count: int, cuda_visible_devices: str | None) -> list[int]:
    """NVML indices of the GPUs torch numbers 0, 1, ...

    NVML lists every GPU; CUDA_VISIBLE_DEVICES="2,0" makes torch's cuda:0 NVML's GPU 2. Entries that
    are not plain indices (UUIDs, MIG names) cannot be mapped here, so then every GPU is listed.
    """
    if cuda_visible_devices is None:
        return list(range(nvml_count))
    entries = [e.strip() for e in cuda_visible_devices.split(",") if e.strip()]
    if not all(e.isdigit() for e in entries):
        return list(range(nvml_count))
    visible = []
    for entry in entries:
        index = int(entry)
        if index >= nvml_count or index in visible:
            break  # CUDA stops at the first invalid entry
        visible.append(index)
    return visible


def gpu_statuses() -> list[GpuStatus]:
    """Every GPU torch can use, with its current memory use and utilisation; [] without NVML."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver or no GPU: a CPU machine
        return []
    try:
        indices = visible_nvml_indices(pynvml.nvmlDeviceGetCount(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        return [_read_gpu(pynvml, torch_index, nvml_index) for torch_index, nvml_index in enumerate(indices)]
    except pynvml.NVMLError:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _read_gpu(pynvml, torch_index: int, nvml_index: int) -> GpuStatus:
    handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
    name = pynvml.nvmlDeviceGetName(handle)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        utilization_pct = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except pynvml.NVMLError:  # e.g. MIG instances do not report utilisation
        utilization_pct = None
    return GpuStatus(
        index=torch_index,
        name=name.decode() if isinstance(name, bytes) else str(name),
        memory_total_mb=memory.total / 2**20,
        memory_used_mb=memory.used / 2**20,
        utilization_pct=utilization_pct,
    )

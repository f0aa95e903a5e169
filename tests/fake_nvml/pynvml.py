"""A stand-in for nvidia-ml-py's ``pynvml`` that reports made-up GPUs: the edge Parallax reads
GPUs through, faked so tests pin the kind of machine they test whatever the real one is.

In the test process, install it with ``nvml_machines.fake_nvml`` (a fixture). In a subprocess,
put this folder first on PYTHONPATH and describe the GPUs in FAKE_NVML_GPUS as JSON (a list of
the dicts below); without FAKE_NVML_GPUS ``nvmlInit`` fails as it does on a machine without a driver.

    {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-…", "bus_id": "00000000:3B:00.0",
     "memory_total_mb": 40960, "memory_used_mb": 1024, "utilization_pct": 35,
     "power_w": 250.0, "temperature_c": 61, "sm_clock_mhz": 1410, "energy_counter": true, "capability": [8, 0],
     "migs": [{"uuid": "MIG-…", "gpu_instance": 1, "compute_instance": 0, "name": "…",
               "memory_total_mb": 9856, "memory_used_mb": 0}]}
"""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
_STARTED = time.monotonic()  # the energy counter counts from here, at the board's constant power

GPUS: list[dict] | None = json.loads(os.environ["FAKE_NVML_GPUS"]) if "FAKE_NVML_GPUS" in os.environ else None


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value


def _check() -> list[dict]:
    if GPUS is None:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    return GPUS


def nvmlInit() -> None:
    _check()


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(_check())


def nvmlDeviceGetHandleByIndex(index: int) -> dict:
    gpus = _check()
    if not 0 <= index < len(gpus):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return gpus[index]


def nvmlDeviceGetHandleByUUID(uuid) -> dict:
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    for gpu in _check():
        for device in (gpu, *gpu.get("migs", [])):
            if device["uuid"] == uuid:
                return device
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetUUID(handle: dict) -> str:
    return handle["uuid"]


def nvmlDeviceGetName(handle: dict) -> bytes:
    return handle["name"].encode()  # older pynvml releases return bytes


def nvmlDeviceGetPciInfo(handle: dict) -> SimpleNamespace:
    return SimpleNamespace(busId=handle["bus_id"].encode())


def nvmlDeviceGetMemoryInfo(handle: dict) -> SimpleNamespace:
    return SimpleNamespace(total=int(handle["memory_total_mb"] * 2**20), used=int(handle["memory_used_mb"] * 2**20))


def nvmlDeviceGetUtilizationRates(handle: dict) -> SimpleNamespace:
    if handle.get("utilization_pct") is None:  # MIG devices report none
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return SimpleNamespace(gpu=handle["utilization_pct"], memory=0)


def nvmlDeviceGetCudaComputeCapability(handle: dict) -> tuple[int, int]:
    return tuple(_reading(handle, "capability"))  # JSON gives a list; a MIG instance says none here


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle: dict) -> dict:
    for gpu in _check():
        if any(mig is handle for mig in gpu.get("migs", [])):
            return gpu
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetMaxMigDeviceCount(handle: dict) -> int:
    return 7 if handle.get("migs") else 0


def nvmlDeviceGetMigDeviceHandleByIndex(handle: dict, index: int) -> dict:
    migs = handle.get("migs", [])
    if index >= len(migs):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return migs[index]


def nvmlDeviceGetGpuInstanceId(handle: dict) -> int:
    return handle["gpu_instance"]


def nvmlDeviceGetComputeInstanceId(handle: dict) -> int:
    return handle["compute_instance"]


def _reading(handle: dict, key: str):
    if handle.get(key) is None:  # a board (or MIG instance) that does not report it
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return handle[key]


def nvmlDeviceGetPowerUsage(handle: dict) -> int:
    return int(_reading(handle, "power_w") * 1000)  # milliwatts


def nvmlDeviceGetTemperature(handle: dict, sensor: int) -> int:
    return _reading(handle, "temperature_c")


def nvmlDeviceGetClockInfo(handle: dict, clock: int) -> int:
    return _reading(handle, "sm_clock_mhz")


def nvmlDeviceGetTotalEnergyConsumption(handle: dict) -> int:
    """Millijoules since the fake driver loaded (Volta and later; ``"energy_counter": false`` for older boards)."""
    if not handle.get("energy_counter", True):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(_reading(handle, "power_w") * (time.monotonic() - _STARTED) * 1000)

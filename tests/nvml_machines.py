"""Fixtures that pin the kind of machine a test sees through NVML: a CPU machine (no driver) or
a fake GPU workstation, whatever GPUs the real machine has. Import the ones a module uses:

    from tests.nvml_machines import cpu_machine, two_gpu_machine  # noqa: F401
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

FAKE_NVML_DIR = Path(__file__).resolve().parent / "fake_nvml"

# Listed out of PCI order on purpose, as a driver may: cuda:0 must still be the lowest bus id.
TWO_GPUS = [
    {"name": "NVIDIA RTX A6000", "uuid": "GPU-b1c2d3e4-0000-1111-2222-333344445555", "bus_id": "00000000:AF:00.0",
     "memory_total_mb": 49140, "memory_used_mb": 2048, "utilization_pct": 80, "capability": [8, 6]},
    {"name": "NVIDIA GeForce RTX 4090", "uuid": "GPU-3f2a9c10-aaaa-bbbb-cccc-ddddeeeeffff",
     "bus_id": "00000000:3B:00.0", "memory_total_mb": 24564, "memory_used_mb": 512, "utilization_pct": 5, "capability": [8, 9]},
]


def load_fake_nvml(gpus: list[dict] | None):
    """A fresh fake ``pynvml`` module reporting ``gpus`` (None: no driver)."""
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_NVML_DIR / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.GPUS = gpus
    return module


@pytest.fixture
def fake_nvml(monkeypatch):
    """``fake_nvml(gpus)``: from now on this process's NVML reports ``gpus`` (None: no driver)."""
    def install(gpus: list[dict] | None):
        monkeypatch.setitem(sys.modules, "pynvml", load_fake_nvml(gpus))
    return install


def pin_cuda_count(monkeypatch, count: int) -> None:
    """What torch would count, for the config checks that ask it (the form's "no such GPU")."""
    monkeypatch.setattr("contract.config.cuda_device_count", lambda: count)


@pytest.fixture
def cpu_machine(fake_nvml, monkeypatch):
    fake_nvml(None)
    pin_cuda_count(monkeypatch, 0)


@pytest.fixture
def two_gpu_machine(fake_nvml, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_nvml(TWO_GPUS)
    pin_cuda_count(monkeypatch, len(TWO_GPUS))
    return TWO_GPUS


def subprocess_env(gpus: list[dict] | None, base: dict | None = None) -> dict:
    """An environment whose Python processes see the fake NVML reporting ``gpus``."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKE_NVML_DIR), env.get("PYTHONPATH")]))
    env.pop("FAKE_NVML_GPUS", None)
    if gpus is not None:
        env["FAKE_NVML_GPUS"] = json.dumps(gpus)
    return env

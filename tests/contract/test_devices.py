"""GPU identity: ``cuda:N`` in the Launch page's picker (NVML's name, memory, utilisation) and in
the training processes (CUDA) is the same physical GPU, whatever CUDA_VISIBLE_DEVICES holds
(indices, GPU UUIDs, MIG ids). NVML is faked at the edge with several GPUs listed out of PCI
order; the CUDA side is pinned to PCI order by every process Parallax starts.

    .venv/bin/python -m pytest tests/contract/test_devices.py -q
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import ROOT
from tests.nvml_machines import fake_nvml  # noqa: F401
from contract import devices
A, B, C = "GPU-aaaa1111-0000-0000-0000-000000000000", "GPU-bbbb2222-0000-0000-0000-000000000000", \
    "GPU-aaaa3333-0000-0000-0000-000000000000"
MIG = "MIG-4c5d6e7f-0000-0000-0000-000000000000"
# NVML's own listing, deliberately not in PCI bus order; by bus: A (0x1A), B (0x3B), C (0xAF, MIG on).
GPUS = [
    {"name": "GPU on bus AF", "uuid": C, "bus_id": "00000000:AF:00.0", "memory_total_mb": 40960,
     "memory_used_mb": 0, "utilization_pct": None, "capability": [8, 0],
     "migs": [{"name": "MIG 1g.5gb", "uuid": MIG, "gpu_instance": 7, "compute_instance": 0,
               "memory_total_mb": 4864, "memory_used_mb": 13, "utilization_pct": None}]},
    {"name": "GPU on bus 3B", "uuid": B, "bus_id": "00000000:3B:00.0", "memory_total_mb": 24564,
     "memory_used_mb": 100, "utilization_pct": 50, "capability": [9, 0]},
    {"name": "GPU on bus 1A", "uuid": A, "bus_id": "00000000:1a:00.0", "memory_total_mb": 16384,
     "memory_used_mb": 10, "utilization_pct": 0},
]


def test_visible_device_ids_follow_cuda_visible_devices():
    ids = [A, B, C]
    assert devices.visible_device_ids(ids, None) == [A, B, C]
    assert devices.visible_device_ids(ids, "2,0") == [C, A]
    assert devices.visible_device_ids(ids, "1,7,2") == [B]  # CUDA stops at the first invalid entry
    assert devices.visible_device_ids(ids, "0,0") == [A]  # and at a repeated one
    assert devices.visible_device_ids(ids, "") == []
    assert devices.visible_device_ids(ids, "-1") == []
    assert devices.visible_device_ids(ids, "GPU-bbbb,GPU-aaaa3") == [B, C]  # unique prefixes of UUIDs
    assert devices.visible_device_ids(ids, "GPU-aaaa,1") == []  # an ambiguous prefix names no GPU
    assert devices.visible_device_ids(ids, f" {MIG} ") == [MIG]  # for NVML to look up


def names(statuses) -> list[tuple[int, str]]:
    return [(s.index, s.name) for s in statuses]


@pytest.mark.parametrize("visible, expected", [
    (None, [(0, "GPU on bus 1A"), (1, "GPU on bus 3B"), (2, "GPU on bus AF")]),
    ("1,0", [(0, "GPU on bus 3B"), (1, "GPU on bus 1A")]),
    (f"{B},{A}", [(0, "GPU on bus 3B"), (1, "GPU on bus 1A")]),
    ("GPU-aaaa3", [(0, "GPU on bus AF")]),
    (MIG, [(0, "MIG 1g.5gb")]),
    (f"MIG-{C}/7/0", [(0, "MIG 1g.5gb")]),  # the older MIG id form
    (f"MIG-{C}/3/0", []),  # no such instance
    ("MIG-00000000-dead", []),
])
def test_the_picker_describes_the_gpu_cuda_numbers_the_same(fake_nvml, monkeypatch, visible, expected):  # noqa: F811
    fake_nvml(GPUS)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    statuses = devices.gpu_statuses()
    assert names(statuses) == expected


@pytest.mark.parametrize("visible", [None, "1,0", "2", f"{B},{A}", "GPU-aaaa3", MIG, f"MIG-{C}/3/0", "0,7,1"])
def test_the_gpu_count_is_the_picker_s_without_torch(fake_nvml, monkeypatch, visible):  # noqa: F811
    fake_nvml(GPUS)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert devices.visible_gpu_count() == len(devices.gpu_statuses())


def test_without_a_driver_the_gpu_count_is_not_known(fake_nvml):  # noqa: F811
    fake_nvml(None)
    assert devices.visible_gpu_count() is None


def test_each_status_carries_its_memory_utilisation_uuid_and_compute_capability(fake_nvml, monkeypatch):  # noqa: F811
    fake_nvml(GPUS)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"1,{MIG}")
    first, mig = devices.gpu_statuses()
    assert (first.uuid, first.memory_total_mb, first.memory_used_mb, first.utilization_pct) == (B, 24564, 100, 50)
    assert first.compute_capability == (9, 0)
    assert (mig.uuid, mig.memory_total_mb, mig.utilization_pct, mig.compute_capability) == (MIG, 4864, None, (8, 0))


def test_a_machine_without_a_driver_has_no_gpus(fake_nvml):  # noqa: F811
    fake_nvml(None)
    assert devices.gpu_statuses() == []


def test_every_parallax_process_numbers_cuda_devices_by_pci_bus(parallax_home):
    """The CLI (and so a launched run's supervisor, its spawned ranks and torchrun's ranks, which all
    start as ``python -m trainer_backend``) pins the order before torch is imported, even over
    the caller's own setting."""
    probe = ("import os, runpy, sys\n"
             "sys.argv = ['trainer_backend', 'list']\n"
             "try:\n    runpy.run_module('trainer_backend', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('order', os.environ.get('CUDA_DEVICE_ORDER'))\n")
    env = {"PARALLAX_HOME": str(parallax_home), "CUDA_DEVICE_ORDER": "FASTEST_FIRST", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.strip().splitlines()[-1] == "order PCI_BUS_ID", result.stdout + result.stderr

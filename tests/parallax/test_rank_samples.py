"""Each rank's system samples in a script run, on a faked GPU workstation (NVML is the edge that cannot exist
here): a rank samples its own process and its own GPU (cuda:LOCAL_RANK); the machine's CPU and memory come
from local rank 0 only."""

from __future__ import annotations

import os

from db import script_metrics
from parallax.ranks import RankInfo
from parallax.sinks import RankSampler
from tests.nvml_machines import fake_nvml, two_gpu_machine  # noqa: F401


def test_each_rank_samples_its_process_and_its_gpu_and_local_rank_0_the_machine(engine, two_gpu_machine):  # noqa: F811
    run_id = script_metrics.create_script_run(engine, name="ddp", project="p", config={}, key="script:k", world_size=2)
    rows = {}
    for rank in (0, 1):
        sampler = RankSampler(engine, run_id, 0.0, RankInfo(rank=rank, local_rank=rank, world_size=2, node=0))
        sampler.watch({rank: os.getpid()})
        sampler.start()
        try:
            rows[rank] = sampler.sample()
        finally:
            sampler.stop()
    # cuda:0 is the lower PCI bus id (the 4090 listed second), as torch numbers them here.
    assert [gpu["index"] for gpu in rows[0]["gpus"]] == [0] and [gpu["index"] for gpu in rows[1]["gpus"]] == [1]
    assert rows[0]["gpus"][0]["memory_used_mb"] == 512 and rows[1]["gpus"][0]["memory_used_mb"] == 2048
    assert [p["rank"] for p in rows[0]["processes"]] == [0] and [p["rank"] for p in rows[1]["processes"]] == [1]
    assert rows[0]["host_cpu_pct"] is not None and rows[0]["host_memory_mb"] > 0
    assert rows[1]["host_cpu_pct"] is None and rows[1]["host_memory_mb"] is None


def test_a_script_that_hides_every_gpu_samples_none(engine, two_gpu_machine, monkeypatch):  # noqa: F811
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    run_id = script_metrics.create_script_run(engine, name="cpu", project="p", config={}, key="script:c")
    sampler = RankSampler(engine, run_id, 0.0, RankInfo(rank=0, local_rank=0, world_size=1, node=0))
    sampler.start()
    try:
        assert sampler.sample()["gpus"] == []
    finally:
        sampler.stop()

"""The CUDA paths: NCCL DDP, DataParallel, model parallel over two GPUs, AMP.

These run on a GPU workstation with ``make test``; where CUDA is absent they skip (and only then).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import run_cli

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
one_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs")


def train(home, *flags):
    result = run_cli("run", "--dataset", "digits", "--model", "resnet18", "--epochs", "1", *flags, home=home)
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = result.stdout.strip().splitlines()[-1].split()[0].split("=")[1]
    run = json.loads(run_cli("export", run_id, home=home).stdout)
    assert run["status"] == "completed"
    epoch = run["epochs"][0]
    assert all(math.isfinite(epoch[k]) for k in ("train_loss", "val_acc", "images_per_s"))
    return run


@one_gpu
@pytest.mark.parametrize("amp", ["bf16", "fp16", "off"])
def test_single_gpu_with_amp(parallax_home, amp):
    run = train(parallax_home, "--strategy", "single", "--devices", "0", "--amp", amp)
    assert set(run["epochs"][0]["peak_memory_mb"]) == {"cuda:0"}


@two_gpus
def test_ddp_over_two_gpus_with_nccl(parallax_home):
    run = train(parallax_home, "--strategy", "ddp", "--devices", "0,1", "--batch-size", "128")
    assert set(run["epochs"][0]["peak_memory_mb"]) == {"cuda:0", "cuda:1"}


@two_gpus
def test_dataparallel_over_two_gpus(parallax_home):
    run = train(parallax_home, "--strategy", "dp", "--devices", "0,1")
    assert not any("pass-through" in note for note in run["notes"])
    assert set(run["epochs"][0]["peak_memory_mb"]) == {"cuda:0", "cuda:1"}


@two_gpus
def test_model_parallel_over_two_gpus(parallax_home):
    run = train(parallax_home, "--strategy", "mp", "--devices", "cuda:0,cuda:1")
    memory = run["epochs"][0]["peak_memory_mb"]
    assert set(memory) == {"cuda:0", "cuda:1"} and all(v > 0 for v in memory.values())

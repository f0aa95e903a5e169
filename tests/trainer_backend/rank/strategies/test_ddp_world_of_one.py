"""ddp and fsdp on one device train as a world of one: one process, a process group of its own,
no spawn. And a rank that is not given a rendezvous store fails at once instead of waiting for
one in C++, where no signal reaches it."""

from __future__ import annotations

import json
import os

import pytest

from tests.support import run_cli, run_python

TINY = ("--dataset", "digits", "--model", "test_resnet", "--image-size", "16", "--batch-size", "256", "--epochs", "1")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_one_device_trains_as_a_world_of_one(parallax_home, strategy):
    # About 10 s each on a quiet 2-core machine; the bound is for a hang, not for speed.
    result = run_cli("run", "--strategy", strategy, "--devices", "cpu", *TINY, home=parallax_home, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1].endswith("status=completed")
    run_id = result.stdout.strip().splitlines()[-1].split()[0].split("=")[1]
    run = json.loads(run_cli("export", run_id, home=parallax_home, timeout=60).stdout)
    assert run["status"] == "completed" and run["world_size"] == 1
    assert any("world of one" in note for note in run["notes"])
    assert run["epochs"][0]["peak_memory_mb"].keys() == {"cpu"}


def test_a_rank_without_a_store_fails_at_once():
    code = ("from contract.config import RunConfig\n"
            "from trainer_backend.rank.strategies import DistributedStrategy\n"
            "DistributedStrategy(RunConfig(strategy='ddp', devices='cpu,cpu'), 1).setup()\n")
    result = run_python(["-c", code], env=dict(os.environ), timeout=120)
    assert result.returncode != 0
    assert "rank 1 of 2 was started without the run's rendezvous store" in result.stderr

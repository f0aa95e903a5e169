"""A resume point across the ranks of a world (rank/resume.py): two gloo ranks save a point and restore it,
with a spy on the broadcast that would carry the point to every rank. Each rank loads the point itself where
it can read it (a shared home): only which point, and its checksum, go between the ranks; the point itself
travels only to a rank whose machine lacks it. Every rank's augmentation generators resume where they were.

    .venv/bin/python -m pytest tests/trainer_backend/rank/test_resume_ranks.py -q
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from contract.config import RunConfig
from tests.support import leave_with_results, run_world
from trainer_backend.rank import resume
from trainer_backend.rank.inputs import DeviceInputs
from trainer_backend.rank.strategies.registry import make_strategy

pytestmark = pytest.mark.processes

WORLD_TIMEOUT_S = 180
CONFIG = RunConfig(strategy="ddp", devices=("cpu", "cpu"), batch_size=8, augment="flip,crop")


def _tensors_in(value) -> int:
    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, dict):
        return sum(_tensors_in(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensors_in(v) for v in value)
    return 0


def _draws(inputs: DeviceInputs) -> list[list[float]]:
    """A batch of four different images (a flip or crop of each changes it), flipped and cropped."""
    pixels = (torch.arange(4 * 3 * 8 * 8) * 7 % 251).reshape(4, 3, 8, 8)
    return inputs(pixels, train=True).flatten(1)[:, :16].tolist()


def _points_world(rank: int, port: int, root: str, out_path: str, kind: str = "cpu") -> None:
    """Save a point into a folder both ranks read; restore it (1) from there, (2) where rank 1's own folder
    holds an older point. Each time: what the broadcast carried, and whether the weights and every rank's
    augmentation draws after the point came back as they were. ``kind``: "cpu" (gloo) or "cuda" (NCCL, a GPU
    each: tests/system/test_gpu.py)."""
    config = CONFIG if kind == "cpu" else CONFIG.replace(devices=("cuda:0", "cuda:1"))
    strategy = make_strategy(config, rank, store_host="127.0.0.1", store_port=port)
    strategy.setup()
    torch.manual_seed(0)
    model = strategy.wrap(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy.inputs = DeviceInputs.for_run(config, lambda pixels: pixels.float(), strategy.input_device, rank)
    carried = []
    broadcast = dist.broadcast_object_list

    def spy(objects, src=0, group=None, device=None, **kwargs):
        broadcast(objects, src=src, group=group, device=device, **kwargs)
        carried.append(_tensors_in(objects))

    dist.broadcast_object_list = spy
    shared = Path(root, "shared")
    _draws(strategy.inputs)  # the epoch's draws so far
    resume.save_resume_point(shared, strategy, model, optimizer, None, epoch=2, best_acc=0.5)
    dist.barrier()  # written by rank 0: a restarted job reads it, long after
    weights = [p.detach().clone() for p in model.parameters()]
    expected = _draws(strategy.inputs)  # what the epoch draws after the point
    results = {}
    for case in ("shared", "rank 1 lacks it"):
        folder = shared
        if case != "shared":
            folder = Path(root, f"rank{rank}")  # each machine's own folder: rank 1's holds an older point
            shutil.copytree(shared, folder)
            if rank == 1:
                (folder / resume.RESUME_EPOCH_FILE).write_text(json.dumps({"epoch": 1, "sha256": "0" * 64}))
            dist.barrier()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(1.0)  # trained on after the point
        _draws(strategy.inputs)
        carried.clear()
        resumed = resume.restore(folder, strategy, model, optimizer, None)
        results[case] = {"start_epoch": resumed.start_epoch, "carried": list(carried),
                         "weights": all(torch.equal(p, w) for p, w in zip(model.parameters(), weights)),
                         "draws": _draws(strategy.inputs) == expected}
    gathered = [None, None]
    dist.all_gather_object(gathered, results)
    strategy.teardown()
    leave_with_results(rank, {"ranks": gathered}, out_path)


def test_each_rank_loads_a_point_it_can_read_and_only_a_token_goes_between_them(tmp_path):
    out = tmp_path / "rank0.json"
    run_world(_points_world, 2, str(tmp_path), str(out), timeout_s=WORLD_TIMEOUT_S)
    ranks = json.loads(out.read_text())["ranks"]
    for rank in ranks:
        shared, lacking = rank["shared"], rank["rank 1 lacks it"]
        assert shared["carried"] == [] and shared["start_epoch"] == 3, rank  # no state went through the devices
        assert shared["weights"] and shared["draws"], rank
        # A machine without the newest point gets it from one that has it: only then does the state travel.
        assert lacking["carried"] and all(count > 0 for count in lacking["carried"]) and lacking["start_epoch"] == 3
        assert lacking["weights"] and lacking["draws"], rank

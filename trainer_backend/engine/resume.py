"""Resumable checkpoints, one per finished epoch, for runs that ``torchrun --max-restarts N`` may restart.

    save_resume_point(folder, strategy, model, optimizer, train_loader, epoch=3, best_acc=0.91)   # every rank
    start_epoch, best_acc = restore(folder, strategy, model, optimizer, train_loader)            # every rank

Rank 0 writes ``resume.pt`` in the run's folder (model and optimizer state, the learning-rate schedule's
position, the epoch, the best accuracy so far, the random number generators) after the epoch is recorded, so an epoch is either recorded and
in the checkpoint or trained again and recorded once, replacing nothing twice. After a restart
rank 0 may sit on another machine: every rank says which epoch its own machine's checkpoint holds
and the newest is sent from there to all. Both functions are collectives.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from trainer_backend.contract.storage import writing
from trainer_backend.engine.strategies import Strategy
from trainer_backend.contract.world import torchrun_world

RESUME_FILE, RESUME_EPOCH_FILE = "resume.pt", "resume.json"


def restart_count() -> int:
    """How often torchrun has restarted this job (0 for its first attempt, and outside torchrun)."""
    world = torchrun_world()
    return world.restart_count if world is not None else 0


def save_resume_point(folder: Path, strategy: Strategy, model: nn.Module, optimizer, train_loader,
                      *, epoch: int, best_acc: float, schedule=None) -> None:
    state = strategy.resume_state(model, optimizer)
    if not strategy.is_main:
        return
    device = strategy.input_device
    generator = getattr(train_loader, "generator", None)  # the seeded shuffle of loaders without a sampler
    point = {
        "epoch": epoch,
        "best_acc": best_acc,
        "world_size": strategy.world_size,
        "state": state,
        "rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "loader_rng": generator.get_state() if generator is not None else None,
        "schedule": schedule.state_dict() if schedule is not None else None,
    }
    # Through part files: a crash or a full disk mid-save leaves the previous epoch's point whole.
    with writing(folder / RESUME_FILE, "resume point") as handle:
        torch.save(point, handle)
    # Written after the checkpoint: it may lag behind it, never run ahead of it.
    with writing(folder / RESUME_EPOCH_FILE, "resume point") as handle:
        handle.write(json.dumps({"epoch": epoch}).encode())


def _local_epoch(folder: Path) -> int:
    try:
        epoch = int(json.loads((folder / RESUME_EPOCH_FILE).read_text())["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    return epoch if (folder / RESUME_FILE).exists() else 0


def restore(folder: Path, strategy: Strategy, model: nn.Module, optimizer, train_loader,
            schedule=None) -> tuple[int, float]:
    """Load the newest resume point any rank's machine holds: (first epoch to train, best accuracy).
    (1, -1.0) when there is none."""
    epochs: list[int | None] = [None] * strategy.world_size
    dist.all_gather_object(epochs, _local_epoch(folder))
    newest = max(epochs)
    if newest == 0:
        return 1, -1.0
    source = epochs.index(newest)
    # Onto the CPU: the point travels to every rank, and each rank's load_state_dict puts it on
    # that rank's own device (without map_location it would come back on the saving rank's GPU).
    holder = [torch.load(folder / RESUME_FILE, weights_only=True, map_location="cpu")
              if strategy.rank == source else None]
    dist.broadcast_object_list(holder, src=source)
    point = holder[0]
    strategy.load_resume_state(model, optimizer, point["state"])
    torch.set_rng_state(point["rng"])
    if point["cuda_rng"] is not None and strategy.input_device.type == "cuda":
        torch.cuda.set_rng_state(point["cuda_rng"], strategy.input_device)
    generator = getattr(train_loader, "generator", None)
    if point["loader_rng"] is not None and generator is not None:
        generator.set_state(point["loader_rng"])
    if schedule is not None and point.get("schedule") is not None:
        schedule.load_state_dict(point["schedule"])  # after the optimizer's: its saved lr is replaced by the schedule's
    return point["epoch"] + 1, point["best_acc"]


def resume_note(start_epoch: int, restarts: int) -> str:
    if start_epoch > 1:
        return (f"Resumed at epoch {start_epoch} after restart {restarts} of the torchrun job, from the "
                f"checkpoint of epoch {start_epoch - 1}.")
    return f"Restart {restarts} of the torchrun job started again at epoch 1: no epoch had finished before it."

"""Resumable checkpoints, one per finished epoch, for every run: a failed, cancelled or lost run continues
from its last finished epoch (``parallax resume RUN``, the Run page's Resume), and a torchrun job that
``--max-restarts N`` restarts does the same.

    save_resume_point(folder, strategy, model, optimizer, train_loader, epoch=3, best_acc=0.91)   # every rank
    start_epoch, best_acc = restore(folder, strategy, model, optimizer, train_loader)            # every rank

Rank 0 writes ``resume.pt`` in the run's folder (model and optimizer state, the learning-rate schedule's
position, the fp16 gradient scaler, the epoch, the best accuracy so far, the random number generators, every
rank's augmentation generators) after the epoch is recorded, so an epoch is either recorded and
in the checkpoint or trained again and recorded once, replacing nothing twice. After a restart
rank 0 may sit on another machine: every rank says which point its own machine's folder holds (its epoch,
step and checksum, from ``resume.json``); where every rank holds the newest (a shared home), each loads its
own, and only otherwise is the newest sent from a machine that has it to all. Both functions are collectives
(in a world of one process they read and write the folder alone).

A job told to stop (rank/stopping.py) saves a point mid-epoch: ``step`` optimizer steps of epoch ``epoch`` + 1
trained, with the loader's shuffle state at that epoch's start and the epoch's totals so far (``partial``), so
that the next attempt continues the epoch at the next step and records it once, over all its steps.

``keep`` (``--keep-checkpoints``) bounds the disk: the newest point is ``resume.pt``; with ``keep`` above 1 the
points of earlier epochs stay beside it as ``resume-epoch<N>.pt`` until ``keep`` are kept
(``control.housekeeping.checkpoint_files`` says what they all cost the disk). ``best.pt`` (the best
epoch's weights) is written apart by the recorder and always kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from contract.checkpoint_file import DAMAGED_POINT_ADVICE
from contract.storage import OLDER_RESUME_FILE, RESUME_FILE, write_remaking_folder
from trainer_backend.rank.checkpoint_read import read_checkpoint
from trainer_backend.rank.strategies import Strategy
from contract.world import torchrun_world

RESUME_EPOCH_FILE = "resume.json"
POINT_KEYS = ("epoch", "best_acc", "state", "rng", "cuda_rng", "loader_rng")  # what restore reads without a default


def restart_count() -> int:
    """How often torchrun has restarted this job (0 for its first attempt, and outside torchrun)."""
    world = torchrun_world()
    return world.restart_count if world is not None else 0


@dataclass(frozen=True)
class Resumed:
    """Where training continues: ``start_epoch`` from ``first_step`` (1 unless a stopped epoch continues),
    ``partial``: that epoch's totals before the stop ({"totals": [loss_sum, correct, count], "train_time_s"})."""

    start_epoch: int = 1
    best_acc: float = -1.0
    first_step: int = 1
    partial: dict | None = None


def save_resume_point(folder: Path, strategy: Strategy, model: nn.Module, optimizer, train_loader,
                      *, epoch: int, best_acc: float, schedule=None, scaler=None, keep: int = 1, step: int = 0,
                      partial: dict | None = None, loader_rng: torch.Tensor | None = None) -> None:
    """After finished epoch ``epoch``; with ``step``, mid-way through the next one (``loader_rng``: the loader's
    generator state at that epoch's start)."""
    state = strategy.checkpoints.resume_state(model, optimizer)
    input_rngs = _gather(strategy, _input_generator_states(strategy))  # each rank draws its own augmentations
    if not strategy.is_main:
        return
    device = strategy.input_device
    generator = getattr(train_loader, "generator", None)  # the seeded shuffle of loaders without a sampler
    if loader_rng is None and generator is not None:
        loader_rng = generator.get_state()
    point = {
        "epoch": epoch,
        "best_acc": best_acc,
        "world_size": strategy.world_size,
        "state": state,
        "rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "loader_rng": loader_rng,
        "input_rngs": input_rngs,
        "step": step,
        "partial": partial,
        "schedule": schedule.state_dict() if schedule is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
    }
    if keep > 1 and not step:
        _keep_older_point(folder, keep)
    # Through part files: a crash or a full disk mid-save leaves the previous epoch's point whole.
    digests = []

    def write(handle) -> None:  # a second try (the folder made again) digests anew
        digests.append(hashlib.sha256())
        torch.save(point, _Digesting(handle, digests[-1]))

    write_remaking_folder(folder / RESUME_FILE, "resume point", write)
    # Written after the checkpoint: it may lag behind it, never run ahead of it. Its checksum tells the ranks of a
    # restarted job whether each one's copy is the newest point (restore).
    mark = json.dumps({"epoch": epoch, **({"step": step} if step else {}), "sha256": digests[-1].hexdigest()}).encode()
    write_remaking_folder(folder / RESUME_EPOCH_FILE, "resume point", lambda handle: handle.write(mark))


def _keep_older_point(folder: Path, keep: int) -> None:
    """Move the newest point aside under its epoch's name, then remove the oldest beyond ``keep`` - 1 of them."""
    previous = _local_point(folder)[0]
    if previous:
        with contextlib.suppress(FileNotFoundError):  # gone with the run's folder: the next write makes it again
            (folder / RESUME_FILE).replace(folder / OLDER_RESUME_FILE.format(epoch=previous))
    older = sorted(folder.glob(OLDER_RESUME_FILE.format(epoch="*")), key=lambda p: int(p.stem.rsplit("epoch", 1)[1]))
    for path in older[:max(0, len(older) - (keep - 1))]:
        path.unlink(missing_ok=True)


def _local_point(folder: Path) -> tuple[int, int]:
    """(finished epoch, steps trained of the next) of this machine's point; (0, 0) when there is none."""
    return _local_token(folder)[:2]


def _local_token(folder: Path) -> tuple[int, int, str | None]:
    """(finished epoch, steps trained of the next, the point's checksum) of this machine's point: which point it
    is, small enough to send to every rank; (0, 0, None) when there is none."""
    try:
        named = json.loads((folder / RESUME_EPOCH_FILE).read_text())
        token = int(named["epoch"]), int(named.get("step", 0)), named.get("sha256")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0, 0, None
    return token if (folder / RESUME_FILE).exists() else (0, 0, None)


class _Digesting:
    """A file handle that adds what is written through it to ``digest``."""

    def __init__(self, handle, digest):
        self.handle, self.digest = handle, digest

    def write(self, data) -> int:
        self.digest.update(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


def _gather(strategy: Strategy, mine):
    """Every rank's ``mine``, in rank order (a collective where there are several processes)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [mine] * strategy.world_size
    gathered = [None] * strategy.world_size
    dist.all_gather_object(gathered, mine)
    return gathered


def _input_generator_states(strategy: Strategy) -> list[torch.Tensor]:
    """The states of this rank's augmentation and crop generators (rank/inputs.py), on the CPU."""
    inputs = getattr(strategy, "inputs", None)
    return inputs.generator_states() if inputs is not None else []


def restore(folder: Path, strategy: Strategy, model: nn.Module, optimizer, train_loader,
            schedule=None, scaler=None) -> Resumed:
    """Load the newest resume point any rank's machine holds: where training continues (the first epoch to
    train, the best accuracy so far, the step a stopped epoch continues from); ``Resumed()`` when there is none."""
    mine = _local_token(folder)
    tokens = _gather(strategy, mine)  # which point each rank's machine holds: a few bytes each
    newest = max(tokens, key=lambda token: token[:2])
    if newest[:2] == (0, 0):
        return Resumed()
    # Onto the CPU: each rank's load_state_dict puts the point on that rank's own device (without map_location it
    # would come back on the saving rank's GPU); a damaged point is one line naming it (checkpoint_read).
    def load() -> dict:
        return read_checkpoint(folder / RESUME_FILE, "resume point", DAMAGED_POINT_ADVICE, needs=POINT_KEYS)

    if all(token == newest for token in tokens):
        point = load()  # the shared home, or a copy on every machine: each rank reads its own
    else:
        # A machine without the newest point (its own folder, not shared): it travels from one that has it,
        # pickled through every rank's device, as much memory as the state itself.
        source = tokens.index(newest)
        holder = [load() if strategy.rank == source else None]
        dist.broadcast_object_list(holder, src=source)
        point = holder[0]
    strategy.checkpoints.load_resume_state(model, optimizer, point["state"])
    torch.set_rng_state(point["rng"])
    if point["cuda_rng"] is not None and strategy.input_device.type == "cuda":
        torch.cuda.set_rng_state(point["cuda_rng"], strategy.input_device)
    generator = getattr(train_loader, "generator", None)
    if point["loader_rng"] is not None and generator is not None:
        generator.set_state(point["loader_rng"])
    input_rngs = point.get("input_rngs")
    inputs = getattr(strategy, "inputs", None)
    if input_rngs and len(input_rngs) == strategy.world_size and inputs is not None:  # another world draws anew
        inputs.set_generator_states(input_rngs[strategy.rank])
    if schedule is not None and point.get("schedule") is not None:
        schedule.load_state_dict(point["schedule"])  # after the optimizer's: its saved lr is replaced by the schedule's
    if scaler is not None and point.get("scaler") is not None:
        scaler.load_state_dict(point["scaler"])
    return Resumed(point["epoch"] + 1, point["best_acc"], point.get("step", 0) + 1, point.get("partial"))


def resumed_note(start_epoch: int) -> str:
    return (f"Resumed at epoch {start_epoch} from the checkpoint of epoch {start_epoch - 1} (parallax resume); "
            f"epochs 1 to {start_epoch - 1} are the ones recorded before.")


def step_note(resumed: Resumed) -> str:
    return (f"Resumed at step {resumed.first_step} of epoch {resumed.start_epoch}, from the point saved when the "
            f"job was told to stop; epoch {resumed.start_epoch} is recorded once, over all its steps (its energy "
            f"from step {resumed.first_step} on, per image of those steps).")


def resume_note(start_epoch: int, restarts: int) -> str:
    if start_epoch > 1:
        return (f"Resumed at epoch {start_epoch} after restart {restarts} of the torchrun job, from the "
                f"checkpoint of epoch {start_epoch - 1}.")
    return f"Restart {restarts} of the torchrun job started again at epoch 1: no epoch had finished before it."

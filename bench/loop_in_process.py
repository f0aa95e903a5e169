"""The training loop alone, in one process: Parallax's steps interleaved with bench/plain_loop.py's.

One process, one model, one optimizer. Parallax's ``train_one_epoch`` runs as it does in a run:
fed by Parallax's cached dataset and loader, with the run's real progress writes to SQLite (at
most one a second) and its heartbeat thread beating every 5 s. Its step callback, after the progress
write, takes one step of the hand-written loop (bench/plain_loop.py's ``train_step`` on its own
TensorDataset and DataLoader), so the loops alternate step by step: engine, plain, engine, plain …
(every other epoch plain first, with one plain step before Parallax's epoch). Each side's time is
the sum of its own intervals, so both see the same weights, threads and allocator and, to within a
step, the same moment of the machine. Whole epochs of one loop drift by tens of per cent on a shared
2-core machine; adjacent steps do not.

The plain step leaves its gradients in place (it zeroes them before its backward pass, Parallax
after its optimizer step), so they are dropped between a plain step and the next Parallax step,
outside both clocks: otherwise Parallax's backward pass would add into them, an extra pass over
every parameter that costs about 7 % of a step and is no part of either loop.

    python bench/loop_in_process.py --epochs 8 --batch-size 128 --image-size 32

Prints one JSON line: per epoch, each side's seconds and images, and the per-step times.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from bench.plain_loop import build_model, load_digits_split, train_step  # noqa: E402
from db import make_engine, store  # noqa: E402
from contract.config import RunConfig  # noqa: E402
from trainer_backend.rank.inputs import DeviceInputs  # noqa: E402
from trainer_backend.supervisor.liveness import Heartbeat  # noqa: E402
from trainer_backend.rank.confusion import accumulate  # noqa: E402
from trainer_backend.rank.loop import train_one_epoch  # noqa: E402
from trainer_backend.rank.strategies import Strategy  # noqa: E402
from trainer_backend.rank.trainer import build_loaders, load_data  # noqa: E402
from trainer_backend.telemetry.recorder import PROGRESS_INTERVAL_S, Recorder  # noqa: E402


class PlainSteps:
    """The plain loop, one step at a time: its loader restarts when an epoch's batches run out."""

    def __init__(self, model, loader: DataLoader, optimizer) -> None:
        self.model, self.loader, self.optimizer = model, loader, optimizer
        self.batches = iter(loader)
        self.loss_sum, self.correct, self.seen = 0.0, 0, 0

    def step(self) -> int:
        try:
            images, labels = next(self.batches)
        except StopIteration:
            self.model.train()
            self.batches = iter(self.loader)
            images, labels = next(self.batches)
        loss, correct = train_step(self.model, images, labels, self.optimizer)
        self.loss_sum += loss
        self.correct += correct
        self.seen += len(labels)
        return len(labels)


def interleaved_epoch(model, engine_loader, optimizer, strategy, progress, plain: PlainSteps,
                      plain_first: bool) -> dict:
    """One Parallax epoch and one plain epoch, step by step (plain, engine, … when ``plain_first``,
    else engine, plain, …); each side's own time and images."""
    engine_steps: list[float] = []
    plain_steps: list[float] = []
    plain_images = 0
    resume = 0.0  # when Parallax's clock restarts: after the last plain step

    def plain_step() -> None:
        nonlocal plain_images, resume
        start = time.perf_counter()
        plain_images += plain.step()
        plain_steps.append(time.perf_counter() - start)
        optimizer.zero_grad(set_to_none=True)  # drop the plain step's gradients, on neither clock
        resume = time.perf_counter()

    def after_engine_step(step: int, total: int) -> None:
        nonlocal resume
        progress(step, total)  # Parallax's own work: part of its step
        engine_steps.append(time.perf_counter() - resume)
        if plain_first and step == total:
            resume = time.perf_counter()
        else:
            plain_step()

    if plain_first:
        plain_step()
    else:
        resume = time.perf_counter()
    totals, _ = train_one_epoch(model, engine_loader, optimizer, strategy, on_step=after_engine_step)
    engine_steps[-1] += time.perf_counter() - resume  # the epoch's end, after its last step
    return {"plain_first": plain_first, "parallax_s": sum(engine_steps), "plain_s": sum(plain_steps),
            "parallax_images": int(totals[2].item()), "plain_images": plain_images,
            "parallax_steps_s": engine_steps, "plain_steps_s": plain_steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8, help="measured epochs, after one warm-up epoch")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=32)
    args = parser.parse_args()

    config = RunConfig(dataset="digits", model=args.model, batch_size=args.batch_size, image_size=args.image_size)
    strategy = Strategy(config)
    data = load_data(config)
    strategy.inputs = DeviceInputs.for_run(config, data.train.normalise, strategy.input_device)
    engine_loader, _ = build_loaders(data, config, strategy)
    plain_train, _ = load_digits_split(args.image_size)
    plain_loader = DataLoader(plain_train, batch_size=args.batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = build_model(args.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    plain = PlainSteps(model, plain_loader, optimizer)

    with tempfile.TemporaryDirectory(prefix="parallax-loop-") as folder:
        db = make_engine(f"sqlite:///{folder}/parallax.db")
        run_id = store.create_run(db, config.to_dict(), status="running", world_size=1)
        progress = functools.partial(Recorder(db, run_id).progress, 0)  # (step, total_steps) of epoch 0
        with Heartbeat(db, run_id):
            for plain_first in (False, True):  # warm-up: allocator growth, kernel selection
                interleaved_epoch(model, engine_loader, optimizer, strategy, progress, plain, plain_first)
            # Which loop steps first alternates from epoch to epoch, so neither always follows the other.
            epochs = [interleaved_epoch(model, engine_loader, optimizer, strategy, progress, plain, epoch % 2 == 1)
                      for epoch in range(args.epochs)]
        extra = engine_own_work(engine_loader, plain_loader, model, strategy, progress, epochs)
    print(json.dumps({"threads": torch.get_num_threads(), "epochs": epochs, "extra": extra}), flush=True)


def per_call_s(call, repeats: int) -> float:
    """The median time of ``call`` over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def engine_own_work(engine_loader, plain_loader, model, strategy, progress, epochs: list[dict]) -> dict:
    """What Parallax's step does that the plain step does not, timed piece by piece: its data
    path against the plain one, summing loss and accuracy on the device, and the progress write
    (about one a second, so its cost per step is spread over the steps of a second)."""
    step_s = statistics.median(s for epoch in epochs for s in epoch["parallax_steps_s"])
    data_parallax = per_call_s(lambda: list(engine_loader), 3) / len(engine_loader)
    data_plain = per_call_s(lambda: list(plain_loader), 3) / len(plain_loader)
    images, labels = strategy.to_device(*next(iter(engine_loader)))
    with torch.no_grad():
        logits = model(images)
    loss = torch.nn.functional.cross_entropy(logits, labels)
    totals = torch.zeros(3, dtype=torch.float64)
    sums = per_call_s(lambda: accumulate(totals, loss, logits, labels), 200)
    steps = len(engine_loader)
    write = per_call_s(lambda: progress(steps, steps), 20)  # the last step always writes
    writes_per_step = min(1.0, step_s / PROGRESS_INTERVAL_S)
    parts = {"data path, Parallax minus plain": data_parallax - data_plain, "loss and accuracy sums": sums,
             "progress write (amortised)": write * writes_per_step}
    return {"step_s": step_s, "parts_s": parts, "share": sum(parts.values()) / step_s,
            "progress_write_s": write}


if __name__ == "__main__":
    main()

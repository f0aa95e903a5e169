"""The training loop alone, in one process: the engine's epoch against bench/plain_loop.py's.

One process, one model, one optimizer; epochs alternate between the engine's ``train_one_epoch``
(with the run's real progress writes to SQLite every second and its heartbeat thread beating every
5 s, as in a run) fed by the engine's cached dataset and loader, and the hand-written loop of
bench/plain_loop.py fed by its own TensorDataset. Both see the same weights, threads, allocator
and machine moment, so what differs between them is the loop and its data path, and nothing of
process start-up or of the machine drifting between two processes.

    python bench/loop_in_process.py --pairs 6 --batch-size 128 --image-size 32

Prints one JSON line: images/s of each epoch, ``engine`` and ``plain``, pair by pair.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from bench.plain_loop import build_model, load_digits_split, train_epoch  # noqa: E402
from db import make_engine, store  # noqa: E402
from trainer_backend.config import RunConfig  # noqa: E402
from trainer_backend.lifecycle import Heartbeat  # noqa: E402
from trainer_backend.loop import _accumulate, train_one_epoch  # noqa: E402
from trainer_backend.strategies import Strategy  # noqa: E402
from trainer_backend.trainer import ProgressWriter, build_loaders, load_data  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=32)
    args = parser.parse_args()

    config = RunConfig(dataset="digits", model=args.model, batch_size=args.batch_size, image_size=args.image_size)
    strategy = Strategy(config)
    engine_loader, _ = build_loaders(load_data(config), config, strategy)
    plain_train, _ = load_digits_split(args.image_size)
    plain_loader = DataLoader(plain_train, batch_size=args.batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = build_model(args.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def engine_epoch(progress) -> float:
        totals, seconds = train_one_epoch(model, engine_loader, optimizer, strategy, on_step=progress)
        return totals[2].item() / seconds

    def plain_epoch() -> float:
        start = time.perf_counter()
        _, _, seen = train_epoch(model, plain_loader, optimizer)
        return seen / (time.perf_counter() - start)

    with tempfile.TemporaryDirectory(prefix="parallax-loop-") as folder:
        db = make_engine(f"sqlite:///{folder}/parallax.db")
        run_id = store.create_run(db, config.to_dict(), status="running", world_size=1)
        progress = ProgressWriter(db, run_id)
        with Heartbeat(db, run_id):
            engine_epoch(progress), plain_epoch()  # warm-up: allocator growth, kernel selection
            engine, plain = [], []
            for pair in range(args.pairs):
                # Alternate which goes first, so neither always follows the other.
                if pair % 2:
                    plain.append(plain_epoch())
                    engine.append(engine_epoch(progress))
                else:
                    engine.append(engine_epoch(progress))
                    plain.append(plain_epoch())
        extra = engine_own_work(engine_loader, plain_loader, model, strategy, progress, engine)
    print(json.dumps({"threads": torch.get_num_threads(), "engine": engine, "plain": plain, "extra": extra}),
          flush=True)


def per_call_s(call, repeats: int) -> float:
    """The median time of ``call`` over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def engine_own_work(engine_loader, plain_loader, model, strategy, progress, engine_speeds) -> dict:
    """What the engine's epoch does that the plain loop does not, timed piece by piece, per step:
    its data path against the plain one, summing loss and accuracy on the device, and the progress
    write (about one a second, so its cost per step is spread over the steps of a second)."""
    steps = len(engine_loader)
    batch = engine_loader.batch_size
    step_s = batch / statistics.median(engine_speeds)
    data_engine = per_call_s(lambda: list(engine_loader), 3) / steps
    data_plain = per_call_s(lambda: list(plain_loader), 3) / len(plain_loader)
    images, labels = next(iter(engine_loader))
    with torch.no_grad():
        logits = model(images)
    loss = torch.nn.functional.cross_entropy(logits, labels)
    totals = torch.zeros(3, dtype=torch.float64)
    accumulate = per_call_s(lambda: _accumulate(totals, loss, logits, labels), 200)
    write = per_call_s(lambda: progress(steps, steps), 20)  # the last step always writes
    writes_per_step = min(1.0, step_s / progress.min_interval_s)
    parts = {"data path, engine minus plain": data_engine - data_plain, "loss and accuracy sums": accumulate,
             "progress write (amortised)": write * writes_per_step}
    return {"step_s": step_s, "parts_s": parts, "share": sum(parts.values()) / step_s,
            "progress_write_s": write}


if __name__ == "__main__":
    main()

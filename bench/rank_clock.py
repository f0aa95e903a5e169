"""Rank-clock cost: what Parallax's rank-time telemetry adds to a DDP or FSDP training step, beside
what DDP and FSDP themselves add to a bare module.

Parallax times each rank's wait in collectives with hooks of its own (telemetry/rank_times.py): under
DDP a Python comm hook around DDP's all-reduce and two forward pre-hooks, under FSDP hooks on either
side of FSDP's on every sharded block. They run on the host every step, so they matter where steps
are short: a small model on a fast GPU is host-bound. Measured in one process, a world of one on gloo
(CPU, one thread), timm's test_resnet at 16x16, batch 8 (steps of about 10 ms, most of them host
work): the bare module, the module under DDP and under FSDP as a hand-written script wraps it, and
under each as Parallax's strategies wrap it (its DDP and FSDP ``wrap``: the same wrappers and the
rank clock). Each figure is the median over 200 steps of the difference between a step of one and
the step of the other right beside it (steps interleaved one by one, after 20 warm-up steps each).

    python bench/rank_clock.py            # full: 5 repeats
    python bench/rank_clock.py --quick    # 20 steps, one repeat
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import parse_args  # noqa: E402
from bench.report import Report  # noqa: E402

METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
MODEL, IMAGE_SIZE, BATCH = "test_resnet", 16, 8
WARMUP_STEPS = 20


def build(kind: str, strategies: dict):
    """(model, optimizer, clock) for ``kind``: "bare", "ddp" / "fsdp" (hand-wrapped, no clock), or
    "Parallax ddp" / "Parallax fsdp" (Parallax's own wrap, the clock included)."""
    import timm
    import torch
    from torch import nn

    from trainer_backend.telemetry.rank_times import RankClock

    torch.manual_seed(0)
    model = timm.create_model(MODEL, num_classes=10, in_chans=1)
    clock = RankClock(torch.device("cpu"))
    if kind == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    elif kind == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from trainer_backend.rank.strategies.fsdp import sharded_blocks

        mesh = init_device_mesh("cpu", (1,))
        for block in sharded_blocks(model):
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif kind.startswith("Parallax "):
        strategy = strategies[kind.split()[1]]
        model, clock = strategy.wrap(model), strategy.rank_clock
    return model, torch.optim.Adam(model.parameters(), lr=1e-3), clock


def step_s(model, optimizer, clock, images, labels) -> float:
    import torch.nn.functional as F

    started = time.perf_counter()
    loss = F.cross_entropy(model(images), labels)
    with clock.backward():
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def paired_ms(first, second, steps: int, batch) -> float:
    """Median over ``steps`` of (a step of ``second`` - the step of ``first`` beside it), in ms."""
    for _ in range(WARMUP_STEPS):
        step_s(*first, *batch), step_s(*second, *batch)
    differences = []
    for _ in range(steps):
        a = step_s(*first, *batch)
        differences.append(step_s(*second, *batch) - a)
    return 1e3 * statistics.median(differences)


def main() -> None:
    args = parse_args(__doc__)
    report = Report("rank_clock", "Rank-clock cost (Parallax's telemetry under DDP and FSDP)", method=METHOD)
    import torch

    from contract.config import RunConfig
    from trainer_backend.rank.strategies.registry import make_strategy

    torch.set_num_threads(1)
    steps = 20 if args.quick else 200
    common = dict(dataset="digits", model=MODEL, image_size=IMAGE_SIZE, batch_size=BATCH, devices=("cpu",))
    strategies = {name: make_strategy(RunConfig(strategy=name, **common)) for name in ("ddp", "fsdp")}
    strategies["ddp"].setup()  # the process group of one that both wrap in
    torch.set_num_threads(1)  # setup gives a process its share of the cores
    batch = (torch.randn(BATCH, 1, IMAGE_SIZE, IMAGE_SIZE), torch.randint(0, 10, (BATCH,)))
    pairs = {"DDP over the bare module": ("bare", "ddp"), "the rank clock over DDP": ("ddp", "Parallax ddp"),
             "FSDP over the bare module": ("bare", "fsdp"), "the rank clock over FSDP": ("fsdp", "Parallax fsdp")}
    results: dict[str, list[float]] = {name: [] for name in pairs}
    models = {kind: build(kind, strategies) for kind in ("bare", "ddp", "fsdp", "Parallax ddp", "Parallax fsdp")}
    for _ in range(args.repeats):
        for name, (first, second) in pairs.items():
            results[name].append(paired_ms(models[first], models[second], steps, batch))
    report.settings = {"model": MODEL, "image_size": IMAGE_SIZE, "batch_size": BATCH, "steps per repeat": steps,
                       "repeats": args.repeats, "threads": 1}
    for name in pairs:
        report.add(f"{name}, per step", results[name], unit=" ms", headline=name.startswith("the rank clock"))
    report.finish(args)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

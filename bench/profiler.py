"""Profiler: what ``--profile`` costs while it records, and that training is at full speed after.

An unprofiled and a profiled run (``--profile``: torch.profiler over the default window of the
first epoch, 1 step skipped, 1 warm-up, 3 kept, shapes and memory on) of the same work (resnet18
on digits at 32x32, batch 128, 2 epochs) are started in turn, five times each (in make bench, in
one rotation with the other benchmarks that share Parallax's runs). Figures:

- later-epoch throughput: the profiled run's training images/s in epoch 2 over the unprofiled
  run's, pair by pair;
- cost per profiled step: the extra training time of the profiled run's first epoch over the
  unprofiled one's, divided by the steps in the window. It includes writing the trace and the
  summaries, which happens inside the epoch when the window closes;
- the step time the profiler itself recorded for its kept steps, next to an unprofiled step;
- the whole process, which also stores the profile in SQLite.

    python bench/profiler.py            # full: 5 repeats
    python bench/profiler.py --quick    # one tiny repeat
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import epoch_field, run_parallax  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import at_least, pair_ratios  # noqa: E402

KEY, TITLE = "profiler", "Profiler"
METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]


def first_epoch(run: dict, name: str) -> float:
    return run["epochs"][0][name]


def steps_per_epoch(settings: dict) -> int:
    train_images = 1437  # digits: 1,797 images, 20 % held out, stratified
    return -(-train_images // settings["batch_size"])


def kept_step_ms(db_url: str, run_id: int) -> float:
    """Median total_ms of the steps the profiler kept (rank 0)."""
    from db import make_engine, profiles

    steps = [s["total_ms"] for s in profiles.read_steps(make_engine(db_url), [run_id]) if s["rank"] == 0]
    if not steps:
        raise RuntimeError(f"profiled run {run_id} stored no profiled steps")
    return statistics.median(steps)


def contenders(settings: dict, db_url: str) -> dict:
    return {"profiled": lambda: run_parallax(settings, db_url, "--profile")}


def fill(report: Report, runs: dict, context) -> None:
    from contract.config import RunConfig

    defaults = RunConfig()
    window = defaults.profile_wait + defaults.profile_warmup + defaults.profile_active
    report.settings["profile window (steps)"] = window
    plain, profiled = runs["parallax"], runs["profiled"]
    kept = [kept_step_ms(context.db_url, r["run_id"]) for r in profiled]
    report.ratio("later-epoch images/s, profiled / unprofiled", [epoch_field(r, "images_per_s") for r in profiled],
                 [epoch_field(r, "images_per_s") for r in plain], target=at_least(0.98))
    extra_s = [first_epoch(p, "train_time_s") - first_epoch(u, "train_time_s") for p, u in zip(profiled, plain)]
    report.add("cost per profiled step (first-epoch extra time / window steps)",
               [1000 * s / window for s in extra_s], unit=" ms")
    unprofiled_step_ms = [1000 * first_epoch(u, "train_time_s") / steps_per_epoch(context.settings) for u in plain]
    report.add("step time the profiler recorded (kept steps)", kept, unit=" ms", headline=False)
    report.add("unprofiled step time (first epoch, mean)", unprofiled_step_ms, unit=" ms", headline=False)
    report.add("first-epoch training time, profiled", [first_epoch(r, "train_time_s") for r in profiled],
               unit=" s", headline=False)
    report.add("first-epoch training time, unprofiled", [first_epoch(r, "train_time_s") for r in plain],
               unit=" s", headline=False)
    report.add("whole process, profiled / unprofiled", pair_ratios([r["wall_s"] for r in profiled],
                                                                   [r["wall_s"] for r in plain]),
               unit="×", headline=False)


if __name__ == "__main__":
    from bench import shared_runs

    shared_runs.run([sys.modules[__name__]], __doc__)

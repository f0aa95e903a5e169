"""DDP on CPU: one process with 2 threads against 2 DDP processes with 1 thread each.

The same global batch (128: DDP gives each of its 2 processes 64) and work (resnet18 on digits at
32x32, Adam, 2 epochs) as ``single`` on ``cpu`` and as ``ddp`` on ``cpu,cpu`` (gloo; Parallax
gives each rank cores // 2 = 1 thread), started in turn, five times each (in make bench, in one
rotation with the other benchmarks that share Parallax's runs). Compared: training
images/s of the second epoch (all ranks together, over the slowest rank's time), epoch
time with validation, and the whole process. No target: this says what DDP buys on a CPU.

    python bench/ddp_cpu.py            # full: 5 repeats
    python bench/ddp_cpu.py --quick    # one tiny repeat
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import epoch_field, run_parallax  # noqa: E402
from bench.report import Report  # noqa: E402

KEY, TITLE = "ddp_cpu", "DDP on CPU"
METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]


def contenders(settings: dict, db_url: str) -> dict:
    return {"ddp": lambda: run_parallax(settings, db_url, strategy="ddp", devices="cpu,cpu")}


def fill(report: Report, runs: dict, context) -> None:
    single, ddp = runs["parallax"], runs["ddp"]
    report.ratio("training images/s, ddp / single", [epoch_field(r, "images_per_s") for r in ddp],
                 [epoch_field(r, "images_per_s") for r in single])
    report.ratio("epoch time with validation, ddp / single", [epoch_field(r, "epoch_time_s") for r in ddp],
                 [epoch_field(r, "epoch_time_s") for r in single], headline=False)
    report.ratio("whole process, ddp / single", [r["wall_s"] for r in ddp], [r["wall_s"] for r in single],
                 headline=False)
    report.add("single: training images/s (epochs 2+)", [epoch_field(r, "images_per_s") for r in single],
               headline=False)
    report.add("ddp: training images/s (epochs 2+)", [epoch_field(r, "images_per_s") for r in ddp], headline=False)
    report.add("single: process", [r["wall_s"] for r in single], unit=" s", headline=False)
    report.add("ddp: process", [r["wall_s"] for r in ddp], unit=" s", headline=False)
    report.add("single: validation accuracy, last epoch", [r["epochs"][-1]["val_acc"] for r in single],
               headline=False)
    report.add("ddp: validation accuracy, last epoch", [r["epochs"][-1]["val_acc"] for r in ddp], headline=False)


if __name__ == "__main__":
    from bench import shared_runs

    shared_runs.run([sys.modules[__name__]], __doc__)

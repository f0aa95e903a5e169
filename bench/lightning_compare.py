"""Against PyTorch Lightning: Parallax's training throughput next to ``lightning.Trainer``'s.

The same model, data, split, batch and optimizer (bench/lightning_loop.py, resnet18 on digits at
32x32, batch 128, Adam, 2 epochs, CPU), Parallax and Lightning started in turn five times each
(in make bench, in one rotation with the other benchmarks that share Parallax's runs).
Compared: training images/s of the second epoch, each as its own side records it (the
Parallax's ``images_per_s``; Lightning's from a callback timing the training batches). Lightning is
installed from requirements-bench.txt; the product does not depend on it.

    python bench/lightning_compare.py            # full: 5 repeats
    python bench/lightning_compare.py --quick    # one tiny repeat, to check the script runs
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import BENCH_DIR, PYTHON, epoch_field, later_epochs, run_timed  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import at_least  # noqa: E402

KEY, TITLE = "lightning_compare", "Against PyTorch Lightning"
METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]


def run_lightning(settings: dict) -> dict:
    done = run_timed([PYTHON, str(BENCH_DIR / "lightning_loop.py"), "--model", settings["model"],
                      "--epochs", str(settings["epochs"]), "--batch-size", str(settings["batch_size"]),
                      "--image-size", str(settings["image_size"])])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": done.seconds, **result}


def unavailable() -> str | None:
    if importlib.util.find_spec("lightning") is None:
        return "lightning is not installed: pip install -r requirements-bench.txt (make bench does)"
    return None


def contenders(settings: dict, db_url: str) -> dict:
    return {"lightning": lambda: run_lightning(settings)}


def fill(report: Report, runs: dict, context) -> None:
    parallax_speed = [epoch_field(r, "images_per_s") for r in runs["parallax"]]
    lightning_speed = [statistics.median(later_epochs([e["images_per_s"] for e in r["epochs"]]))
                       for r in runs["lightning"]]
    report.ratio("training images/s, Parallax / Lightning", parallax_speed, lightning_speed, target=at_least(1.0))
    report.add("Parallax training images/s (epochs 2+)", parallax_speed, headline=False)
    report.add("Lightning training images/s (epochs 2+)", lightning_speed, headline=False)
    report.add("Parallax process", [r["wall_s"] for r in runs["parallax"]], unit=" s", headline=False)
    report.add("Lightning process", [r["wall_s"] for r in runs["lightning"]], unit=" s", headline=False)
    report.settings["lightning"] = runs["lightning"][0]["lightning"]


if __name__ == "__main__":
    from bench import shared_runs

    shared_runs.run([sys.modules[__name__]], __doc__)

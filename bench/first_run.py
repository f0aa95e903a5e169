"""The first run: what a newcomer gets from the Launch form's defaults.

``python -m trainer_backend run --dataset digits`` with every other value left at its default
(``RunConfig``, which the Launch form also starts from: resnet18, 3 epochs, batch 128, Adam 1e-3,
one CPU process) is timed from start to finish, process start and imports included, in turn with
the same run validated on BatchNorm's running averages (``--bn-stats-images 0``), five times each
(dataset cache already built). Both train the very same weights; they differ only in the BatchNorm
statistics validation uses. The cost of re-estimating them is the difference of the two runs'
time per epoch outside training (validation, and re-estimation in the default run).

    python bench/first_run.py            # full: 5 of each
    python bench/first_run.py --quick    # one of each, tiny model
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import Report  # noqa: E402
from bench.stats import alternate, at_least, at_most  # noqa: E402
from bench.common import (  # noqa: E402
    parallax_command,
    export_run,
    parallax_home,
    parse_args,
    prime_dataset_cache,
    run_id_from,
    run_timed,
)

KEY, TITLE = "first_run", "The default run"
METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
QUICK_FLAGS = ("--model", "test_resnet", "--image-size", "16", "--epochs", "1")


def default_run(db_url: str, quick: bool, *extra: str) -> dict:
    done = run_timed(parallax_command("run", "--dataset", "digits", "--quiet", *(QUICK_FLAGS if quick else ()),
                                    *extra, db_url=db_url))
    run = export_run(run_id_from(done.stdout), db_url)
    if run["status"] != "completed":
        raise RuntimeError(f"run {run['run_id']} ended {run['status']}: {run['error']}")
    return {"wall_s": done.seconds, "epochs": run["epochs"], "notes": run["notes"]}


def outside_training_s(run: dict) -> float:
    """Per epoch: epoch time minus training time (validation, and BatchNorm re-estimation if on)."""
    return sum(e["epoch_time_s"] - e["train_time_s"] for e in run["epochs"]) / len(run["epochs"])


def main() -> None:
    args = parse_args(__doc__)
    report = Report(KEY, TITLE, method=METHOD)
    with parallax_home() as home:
        db_url = f"sqlite:///{home / 'parallax.db'}"
        prime_dataset_cache({"dataset": "digits", "image_size": 16 if args.quick else 32}, args.quick)
        runs = alternate({"default": lambda: default_run(db_url, args.quick),
                          "running averages": lambda: default_run(db_url, args.quick, "--bn-stats-images", "0")},
                         args.repeats)
    default, lagging = runs["default"], runs["running averages"]
    report.add("default run, start to finish (2 cores)", [r["wall_s"] for r in default], unit=" s", target=at_most(60))
    report.add("default run, validation accuracy at the last epoch", [100 * r["epochs"][-1]["val_acc"] for r in default],
               unit=" %", target=at_least(90))
    report.add("training accuracy at the last epoch", [100 * r["epochs"][-1]["train_acc"] for r in default],
               unit=" %", headline=False)
    report.add("the same weights validated on running averages (--bn-stats-images 0)",
               [100 * r["epochs"][-1]["val_acc"] for r in lagging], unit=" %", headline=False)
    report.add("re-estimating BatchNorm statistics, per epoch",
               [outside_training_s(d) - outside_training_s(r) for d, r in zip(default, lagging)], unit=" s",
               headline=False)
    noted = sum(any("BatchNorm's running statistics" in n for n in r["notes"]) for r in lagging)
    report.note(f"{noted} of {len(lagging)} runs on running averages got the run note that explains the lag.")
    report.finish(args)


if __name__ == "__main__":
    main()

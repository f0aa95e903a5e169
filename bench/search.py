"""What a search's pruner saves, and what a search costs per trial beyond the runs it launches.

Pruning: one grid of learning rates searched twice, as users start it (``python -m trainer_backend search``), with
the median pruner and with none, one trial at a time and the same sampler seed, so both draw the same trials in
the same order. Figures: the training seconds of every trial (their recorded epochs' ``train_time_s``) and the
epochs trained, pruned over unpruned, and the best validation accuracy each search found (equal when the best
trial was not pruned). Overhead: a search of N trials that differ only in their seed (``--sampler grid``, one at a
time) against the same N configs launched one after another with ``parallax launch``, each waited for until it
ends (a trial is such a launched run: the same detached supervisor, whose OpenMP threads sleep while they wait where a
foreground ``parallax run``'s spin), alternated (A B A B); the overhead per trial is (the search's wall time - the
launched runs' wall time) / N: its driver's start (Optuna's import, the study) and its half-second poll.

    python bench/search.py            # resnet18 on digits at 32 px, 6 learning rates x 4 epochs; 2 trials x 1 epoch
    python bench/search.py --quick    # test_resnet at 16 px, 2 learning rates x 2 epochs; 1 trial x 1 epoch
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import parallax_command, parallax_home, parse_args, prime_dataset_cache, run_timed  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import alternate, at_least  # noqa: E402

KEY, TITLE = "search", "Search: compute saved by pruning, and the cost per trial"
METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
LEARNING_RATES = ("1e-4", "3e-4", "1e-3", "3e-3", "1e-2", "3e-2")


def workload(quick: bool) -> dict:
    if quick:
        return {"model": "test_resnet", "image_size": 16, "rates": LEARNING_RATES[2:4], "epochs": 2, "trials": 1,
                "trial_epochs": 1}
    return {"model": "resnet18", "image_size": 32, "rates": LEARNING_RATES, "epochs": 4, "trials": 2,
            "trial_epochs": 1}


def base_flags(settings: dict, epochs: int) -> list[str]:
    return ["--dataset", "digits", "--model", settings["model"], "--image-size", str(settings["image_size"]),
            "--batch-size", "128", "--epochs", str(epochs)]


def searched(db_url: str, search_id: int) -> dict:
    """The search's trials: training seconds and epochs over all of them, and the best validation accuracy."""
    from db import make_engine, store
    from db.searches import trial_runs

    engine = make_engine(db_url)
    runs = trial_runs(engine, search_id)
    epochs = store.read_epoch_metrics(engine, [run["id"] for run in runs.values()])
    return {"train_s": sum(e["train_time_s"] or 0.0 for e in epochs), "epochs": len(epochs),
            "best_acc": max(e["val_acc"] for e in epochs), "pruned": sum(r["status"] == "pruned" for r in runs.values())}


def launched_and_ended(settings: dict, epochs: int, seed: str, db_url: str) -> float:
    """``parallax launch`` of one config, then waited for until its run ends: its wall time."""
    import time

    from db import make_engine, store

    started = time.perf_counter()
    done = run_timed(parallax_command("launch", *base_flags(settings, epochs), "--seed", seed, db_url=db_url))
    run_id = int(done.stdout.split("run_id=")[1].split()[0])
    engine = make_engine(db_url)
    while (run := store.get_run(engine, run_id)).status in ("queued", "running"):
        time.sleep(0.2)
    if run.status != "completed":
        raise RuntimeError(f"run {run_id} ended {run.status}: {run.error}")
    return time.perf_counter() - started


def search_id_from(output: str) -> int:
    return int(next(line for line in output.splitlines() if line.startswith("search_id=")).split()[0].split("=")[1])


def main() -> None:
    args = parse_args(__doc__)
    settings = workload(args.quick)
    report = Report(KEY, TITLE, method=METHOD)
    report.settings = {key: value for key, value in settings.items()}
    with parallax_home() as home:
        db_url = f"sqlite:///{home / 'parallax.db'}"
        prime_dataset_cache({"dataset": "digits", "image_size": settings["image_size"]}, args.quick)
        grid = ["--param", "lr=" + ",".join(settings["rates"]), "--sampler", "grid", "--trials",
                str(len(settings["rates"])), "--bn-stats-images", "0"]
        outcome = {}
        for pruner in ("median", "none"):
            done = run_timed(parallax_command("search", *base_flags(settings, settings["epochs"]), *grid, "--pruner",
                                            pruner, db_url=db_url), timeout=3600)
            outcome[pruner] = searched(db_url, search_id_from(done.stdout))
            print(f"{KEY} pruner {pruner}: {outcome[pruner]}", flush=True)
        pruned, full = outcome["median"], outcome["none"]
        report.add("training time of all trials, pruned over unpruned", [pruned["train_s"] / full["train_s"]],
                   unit="×")
        report.add("epochs trained, pruned over unpruned", [pruned["epochs"] / full["epochs"]], unit="×")
        report.add("best validation accuracy, pruned search", [100 * pruned["best_acc"]], unit=" %", headline=False)
        report.add("best validation accuracy, unpruned search", [100 * full["best_acc"]], unit=" %", headline=False)
        report.add("best accuracy kept by the pruned search", [100 * pruned["best_acc"] / full["best_acc"]],
                   unit=" %", target=at_least(100.0, " %"))
        report.details["trials_pruned"] = pruned["pruned"]

        trials, epochs = settings["trials"], settings["trial_epochs"]
        seeds = [str(seed) for seed in range(trials)]

        def one_search() -> float:
            return run_timed(parallax_command("search", *base_flags(settings, epochs), "--param",
                                            "seed=" + ",".join(seeds), "--sampler", "grid", "--trials", str(trials),
                                            db_url=db_url), timeout=3600).seconds

        def plain_runs() -> float:
            return sum(launched_and_ended(settings, epochs, seed, db_url) for seed in seeds)

        rounds = 1 if args.quick else max(2, args.repeats // 2)
        walls = alternate({"search": one_search, "plain": plain_runs}, rounds, label=f"{KEY} ")
        report.add("overhead per trial over a plain run",
                   [(s - p) / trials for s, p in zip(walls["search"], walls["plain"])], unit=" s")
        report.ratio("a search's wall time over its trials launched one by one", walls["search"], walls["plain"],
                     headline=False)
    report.finish(args)


if __name__ == "__main__":
    main()

"""SDK log cost: what one ``parallax.log`` call costs the training thread, beside W&B's ``wandb.log``
(offline mode) and MLflow's ``mlflow.log_metrics`` (a local SQLite store) where they are installed.

Each contender logs a dict of 4 numbers per call (a loss, a learning rate, an accuracy and an epoch, as
a training loop does) ``calls`` times in a tight loop on the training thread, and the figure is the
wall time of the loop over the calls: what a step pays. Parallax's run writes to a real SQLite
database in a temporary PARALLAX_HOME, its background thread writing the batches meanwhile (on the
same cores: its cost lands partly in the figure, as it would in training). ``finish`` is outside the
loop for every contender. Peers that are not installed are said in a note (``make bench`` does not
install them).

    python bench/sdk_log.py            # full
    python bench/sdk_log.py --quick    # fewer calls, one repeat
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import parallax_home, parse_args  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import alternate, at_most  # noqa: E402

METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
TARGET_US = 20.0


def values(step: int) -> dict[str, float]:
    return {"train/loss": 1.0 / (step + 1), "lr": 0.01, "train/acc": 0.5, "epoch": float(step // 100)}


def per_call_us(log, calls: int) -> float:
    """Microseconds per ``log(values, step=step)`` call over ``calls`` calls in a tight loop."""
    started = time.perf_counter()
    for step in range(calls):
        log(values(step), step=step)
    return 1e6 * (time.perf_counter() - started) / calls


def parallax_us(calls: int) -> float:
    import parallax

    run = parallax.init(project="bench", name="sdk-log", config={"calls": calls})
    spent = per_call_us(run.log, calls)
    run.finish()
    return spent


def wandb_us(calls: int) -> float:
    import wandb

    with tempfile.TemporaryDirectory() as folder:
        run = wandb.init(project="bench", mode="offline", dir=folder)
        spent = per_call_us(run.log, calls)
        run.finish()
    return spent


def mlflow_us(calls: int) -> float:
    import mlflow

    with tempfile.TemporaryDirectory() as folder:
        mlflow.set_tracking_uri(f"sqlite:///{Path(folder) / 'mlflow.db'}")  # SQLite, as Parallax's
        with mlflow.start_run():
            return per_call_us(mlflow.log_metrics, calls)


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def main() -> None:
    args = parse_args(__doc__)
    calls = 2_000 if args.quick else 50_000
    # The peers are slower per call by orders of magnitude: fewer calls keep their turn short.
    peer_calls = max(200, calls // 25)
    report = Report("sdk_log", "SDK log cost (parallax.log on the training thread)", method=METHOD)
    report.settings = {"calls per repeat": calls, "calls per repeat (peers)": peer_calls,
                       "values per call": len(values(0)), "repeats": args.repeats}
    contenders = {"parallax": lambda: parallax_us(calls)}
    # MLflow writes each call through to its database (tens of ms a call): 200 calls tell its cost.
    peers = {"wandb": ("wandb", wandb_us, peer_calls), "mlflow": ("mlflow", mlflow_us, min(peer_calls, 200))}
    for name, (module, measure, count) in peers.items():
        if installed(module):
            contenders[name] = lambda m=measure, n=count: m(n)
        else:
            report.note(f"{name} is not installed here: not measured (pip install {module} to compare).")
    os.environ.setdefault("WANDB_SILENT", "true")
    with parallax_home():
        results = alternate(contenders, args.repeats)
    report.add("parallax.log, per call", results["parallax"], unit=" µs", target=at_most(TARGET_US))
    labels = {"wandb": "wandb.log (offline), per call", "mlflow": "mlflow.log_metrics (local SQLite), per call"}
    for name in sorted(contenders.keys() - {"parallax"}):
        report.add(labels[name], results[name], unit=" µs", headline=False)
    report.details["per_call_us"] = results
    report.finish(args)


if __name__ == "__main__":
    main()

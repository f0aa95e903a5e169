"""The figures that sum up one run's epochs, each computed here and nowhere else: the Runs, Run,
Compare and Sweeps pages, ``export``, its CSV files and ``list`` all take them from ``run_figures``,
so one run shows one throughput and one training time wherever it is read.

    figures = run_figures(store.read_epoch_metrics(engine, [run_id]))
    figures.images_per_s      # mean over the epochs after the first; the only epoch's for a one-epoch run

Pure Python over epoch rows (dicts with ``epoch``, ``images_per_s``, ``train_time_s``,
``epoch_time_s``, ``val_acc``; missing keys are unmeasured), beneath both the database's summaries
and the reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

# What each figure is called wherever it is shown, and what it holds (a column's help text).
IMAGES_PER_S_LABEL = "throughput (images/s)"
IMAGES_PER_S_HELP = ("Training images per second: the mean over the epochs after the first (the first carries "
                     "start-up costs, and a profiler's when the run is profiled), or the only epoch's.")
TRAINING_TIME_LABEL = "training time (s)"
TRAINING_TIME_HELP = "Time spent on training steps, summed over the epochs: validation and checkpoints left out."
EPOCHS_TIME_LABEL = "epochs' time (s)"
EPOCHS_TIME_HELP = "The epochs' whole time, summed: training, validation and BatchNorm re-estimation."
BEST_VAL_ACC_LABEL = "best val acc"

# What a script's own metric names mean in the columns and charts every run shares: "val/acc", "val_acc" and
# "accuracy/val" are the validation accuracy (names compared as ``name_key`` makes them). Said in a caption
# wherever a script's metric is drawn as one of these.
SHARED_NAMES: dict[str, tuple[str, ...]] = {
    "val_acc": ("val_acc", "val_accuracy", "accuracy_val", "acc_val", "valid_acc", "validation_acc",
                "validation_accuracy", "eval_acc", "eval_accuracy"),
    "train_acc": ("train_acc", "train_accuracy", "accuracy_train", "acc_train", "training_accuracy"),
    "val_loss": ("val_loss", "loss_val", "valid_loss", "validation_loss", "eval_loss"),
    "train_loss": ("train_loss", "loss_train", "training_loss", "loss"),
    "images_per_s": ("images_per_s", "images_per_sec", "img_per_s", "imgs_per_s", "samples_per_s",
                     "samples_per_sec", "throughput"),
}
BEST_VAL_ACC_NAMES = ("best_val_acc", "best_val_accuracy", "best_acc", "best_accuracy", "val_acc_best",
                      "accuracy_val_best", "best_validation_accuracy")


def name_key(name: str) -> str:
    """A metric's name as names are compared: 'Val/Acc', 'val-acc' and 'val acc' are 'val_acc'."""
    return "".join(c if c.isalnum() else "_" for c in name.strip().lower())


def shared_name(name: str) -> str | None:
    """The shared series a script's metric ``name`` is ("val/acc" -> "val_acc"), or None."""
    key = name_key(name)
    return next((shared for shared, names in SHARED_NAMES.items() if key in names), None)


@dataclass(frozen=True)
class RunFigures:
    """One run's summary. None where no epoch has measured it yet."""

    epochs_done: int
    best_val_acc: float | None
    images_per_s: float | None
    images_per_s_epochs: tuple[int, ...]  # the epochs ``images_per_s`` is the mean of
    training_time_s: float | None  # summed train_time_s; None unless every recorded epoch has it
    epochs_time_s: float | None  # summed epoch_time_s (training, validation, BatchNorm re-estimation)

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["images_per_s_epochs"] = list(self.images_per_s_epochs)
        return values


def steady_images_per_s(epochs: Iterable[tuple[int, float | None]]) -> tuple[float | None, tuple[int, ...]]:
    """(Mean images/s over the epochs after the first measured one, those epochs) from
    (epoch, images/s) pairs; the only epoch's with one; (None, ()) before any."""
    measured = sorted((int(epoch), float(value)) for epoch, value in epochs if _number(value))
    if not measured:
        return None, ()
    steady = measured[1:] if len(measured) > 1 else measured
    return sum(value for _, value in steady) / len(steady), tuple(epoch for epoch, _ in steady)


def run_figures(epochs: Iterable[Mapping[str, Any]]) -> RunFigures:
    """The figures of one run's epoch rows (``store.read_epoch_metrics`` rows of that run)."""
    rows = list(epochs)
    images_per_s, steady = steady_images_per_s((row["epoch"], row.get("images_per_s")) for row in rows)
    accuracies = [float(row["val_acc"]) for row in rows if _number(row.get("val_acc"))]
    return RunFigures(
        epochs_done=len(rows),
        best_val_acc=max(accuracies) if accuracies else None,
        images_per_s=images_per_s,
        images_per_s_epochs=steady,
        training_time_s=_total(row.get("train_time_s") for row in rows),
        epochs_time_s=_total(row.get("epoch_time_s") for row in rows),
    )


def script_run_figures(summary: Mapping[str, Any], logged: Mapping[str, Mapping[str, float]]) -> RunFigures:
    """A script run's figures in the fields every run has: from what it summarised (``run.summary``: a best
    accuracy under any of BEST_VAL_ACC_NAMES, else its last values) and what it logged (``logged``: per shared
    series, ``max`` and ``mean`` of the values); None where it gave neither."""
    by_key = {name_key(name): value for name, value in summary.items() if _number(value) and not isinstance(value, bool)}
    best = next((float(by_key[name]) for name in BEST_VAL_ACC_NAMES if name in by_key), None)
    if best is None and "val_acc" in logged:
        best = logged["val_acc"].get("max")
    if best is None:
        best = next((float(by_key[name]) for name in SHARED_NAMES["val_acc"] if name in by_key), None)
    images_per_s = logged.get("images_per_s", {}).get("mean")
    if images_per_s is None:
        images_per_s = next((float(by_key[name]) for name in SHARED_NAMES["images_per_s"] if name in by_key), None)
    return RunFigures(epochs_done=0, best_val_acc=best, images_per_s=images_per_s, images_per_s_epochs=(),
                      training_time_s=None, epochs_time_s=None)


def _total(values: Iterable[Any]) -> float | None:
    """The sum, or None where any value is missing (a partial sum would read as a whole one)."""
    values = list(values)
    if not values or not all(_number(v) for v in values):
        return None
    return float(sum(values))


def _number(value: Any) -> bool:
    # NaN (pandas' missing value) is not a measurement.
    return value is not None and isinstance(value, (int, float)) and value == value

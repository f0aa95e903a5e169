"""What the dashboard reads and writes beyond ``db.store``: the run table, its filter choices,
the runs a comparison needs, their single-device baselines, and the user's tags and notes.

Lists read only the columns they show, and single config fields by JSON path (``batch_size``,
``epochs``, ``devices``), never whole config blobs, so the Runs and Compare pages stay quick
with hundreds of runs. Like ``db.store``, every function returns plain dicts and lists.

    rows = run_table(engine, RunFilters(statuses=("completed",), tags=("baseline",)))
    set_tags(engine, rows[0]["id"], ["baseline", "fp32"])
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, select, update

from contract.strategy_specs import baseline
from db.connection import session_scope
from db.tables import EpochMetric, Run
from db import script_metrics
from db.run_figures import run_figures
from db.script_metrics import SCRIPT_KIND

# What makes two runs the same work: a speedup is only meaningful between runs that agree on these.
LIKE_FOR_LIKE_FIELDS = ("dataset", "model", "batch_size", "image_size", "amp")
SUMMARY_COLUMNS = (EpochMetric.run_id, EpochMetric.epoch, EpochMetric.val_acc, EpochMetric.images_per_s,
                   EpochMetric.train_time_s, EpochMetric.epoch_time_s)


@dataclass(frozen=True)
class RunFilters:
    """Keep runs matching every non-empty filter (any of the values listed for it)."""

    statuses: tuple[str, ...] = ()
    strategies: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()  # "engine" (launched) or "script" (import parallax)


def run_table(engine: Engine, filters: RunFilters = RunFilters()) -> list[dict[str, Any]]:
    """One dict per run, newest first, with a summary of its epochs.

    Keys: id, status, kind, strategy, model, dataset, devices, batch_size, accumulate_steps, effective_batch, epochs,
    epochs_done, best_val_acc, mean_images_per_s (``run_figures``' images_per_s: over the epochs after the
    first), train_time_s (training steps only), epochs_time_s (with validation), tags, user_note,
    created_at, finished_at, summary (a script run's ``run.summary``; {} for others). The epoch figures come
    from ``db.run_figures``, as every page's do; a script run's from what it summarised and logged.
    """
    statement = (
        select(
            Run.id, Run.status, Run.strategy, Run.model, Run.dataset,
            Run.config["devices"].label("devices"),
            Run.config["batch_size"].as_integer().label("batch_size"),
            Run.config["accumulate_steps"].as_integer().label("accumulate_steps"),
            Run.config["epochs"].as_integer().label("epochs"),
            Run.tags, Run.user_note, Run.created_at, Run.finished_at, Run.kind,
        )
        .order_by(Run.created_at.desc(), Run.id.desc())
    )
    for column, wanted in ((Run.status, filters.statuses), (Run.strategy, filters.strategies),
                           (Run.model, filters.models), (Run.dataset, filters.datasets), (Run.kind, filters.kinds)):
        if wanted:
            statement = statement.where(column.in_(wanted))
    with session_scope(engine) as session:
        rows = [row._asdict() for row in session.execute(statement)]
        # The figures' columns only, never the JSON ones: a few numbers per epoch, whatever the run recorded.
        epochs: dict[int, list[dict[str, Any]]] = {}
        listed = statement.with_only_columns(Run.id).order_by(None)
        for row in session.execute(select(*SUMMARY_COLUMNS).where(EpochMetric.run_id.in_(listed))):
            epochs.setdefault(row.run_id, []).append(row._asdict())
    # A script's figures come from what it summarised and logged, in the same fields (db.run_figures).
    scripts = script_metrics.run_figures_of(engine, [row["id"] for row in rows if row["kind"] == SCRIPT_KIND])
    for row in rows:
        figures, row["summary"] = scripts.get(row["id"], (run_figures(epochs.get(row["id"], [])), {}))
        row.update(epochs_done=figures.epochs_done, best_val_acc=figures.best_val_acc,
                   mean_images_per_s=figures.images_per_s, train_time_s=figures.training_time_s,
                   epochs_time_s=figures.epochs_time_s)
        # A script's config may name its devices as it likes ("cuda:0", ["cpu", "cpu"]).
        devices = row["devices"] or []
        row["devices"] = [str(device) for device in devices] if isinstance(devices, list) else [str(devices)]
        row["tags"] = list(row["tags"] or [])
        # Runs recorded before gradient accumulation existed stepped once per batch.
        row["accumulate_steps"] = row["accumulate_steps"] or 1
        row["effective_batch"] = None if row["batch_size"] is None else row["batch_size"] * row["accumulate_steps"]
    if filters.tags:
        # Tags are a JSON list per run; matching them in Python keeps the query portable.
        wanted_tags = set(filters.tags)
        rows = [row for row in rows if wanted_tags.intersection(row["tags"])]
    return rows


def filter_choices(engine: Engine) -> dict[str, list[str]]:
    """The values each run-table filter can take: statuses, strategies, models, datasets, tags, kinds."""
    with session_scope(engine) as session:
        choices = {
            name: sorted(session.scalars(select(column).distinct()))
            for name, column in (("statuses", Run.status), ("strategies", Run.strategy),
                                 ("models", Run.model), ("datasets", Run.dataset), ("kinds", Run.kind))
        }
        tag_lists = session.scalars(select(Run.tags))
        choices["tags"] = sorted({tag for tags in tag_lists for tag in (tags or [])})
    return choices


def runs_for_compare(engine: Engine, run_ids: Iterable[int]) -> list[dict[str, Any]]:
    """The picked runs with their configs (the comparison needs them), in the order given.

    Keys: id, status, strategy, model, dataset, config, world_size, created_at, measurements, kind. Unknown ids
    are skipped.
    """
    run_ids = list(dict.fromkeys(int(i) for i in run_ids))
    if not run_ids:
        return []
    statement = select(Run.id, Run.status, Run.strategy, Run.model, Run.dataset, Run.config,
                       Run.world_size, Run.created_at, Run.measurements, Run.kind).where(Run.id.in_(run_ids))
    with session_scope(engine) as session:
        by_id = {row.id: row._asdict() for row in session.execute(statement)}
    for row in by_id.values():
        devices = row["config"].get("devices")
        if row["kind"] == "script" and devices is not None and not _names(devices):
            # A script names its devices as it likes (0, "cuda:0", [0, 1]): compared as the names they read as.
            row["config"] = {**row["config"], "devices": [str(d) for d in devices] if isinstance(devices, list)
                             else [str(devices)]}
    return [by_id[i] for i in run_ids if i in by_id]


def _names(devices: Any) -> bool:
    return isinstance(devices, list) and all(isinstance(device, str) for device in devices)


def like_key(config: dict[str, Any]) -> tuple:
    """The values two runs must share to be compared like for like."""
    return tuple(config.get(name) for name in LIKE_FOR_LIKE_FIELDS)


def single_device_baselines(engine: Engine, configs: Iterable[dict[str, Any]]) -> dict[tuple, int]:
    """For each config's ``like_key``, the newest completed run of the baseline strategy (the one-device
    strategy of the specs) doing the same work.

    Keys without such a run are left out. Reads four config fields by JSON path, not the blobs.
    """
    wanted = {like_key(config) for config in configs}
    if not wanted:
        return {}
    statement = (
        select(
            Run.id, Run.dataset, Run.model,
            Run.config["batch_size"].as_integer().label("batch_size"),
            Run.config["image_size"].as_integer().label("image_size"),
            Run.config["amp"].as_string().label("amp"),
        )
        .where(Run.strategy == baseline().name, Run.status == "completed",
               Run.dataset.in_({key[0] for key in wanted}), Run.model.in_({key[1] for key in wanted}))
        .order_by(Run.id.desc())
    )
    found: dict[tuple, int] = {}
    with session_scope(engine) as session:
        for row in session.execute(statement):
            key = (row.dataset, row.model, row.batch_size, row.image_size, row.amp)
            if key in wanted and key not in found:
                found[key] = row.id
    return found


def set_tags(engine: Engine, run_id: int, tags: Iterable[str]) -> list[str]:
    """Replace the run's tags (stripped, empty ones and repeats dropped); returns what was stored.
    Held to the bounds a launch has (``parse_tags``: 64 tags of 200 characters), ValueError otherwise."""
    from contract.config import parse_tags  # torch-free; the one place the bounds are kept

    cleaned = list(parse_tags(list(dict.fromkeys(t.strip() for t in tags if t and t.strip()))))
    _update(engine, run_id, tags=cleaned)
    return cleaned


def set_user_note(engine: Engine, run_id: int, note: str) -> None:
    """Replace the user's free-text note on the run."""
    _update(engine, run_id, user_note=(note or "").strip())


def _update(engine: Engine, run_id: int, **values: Any) -> None:
    with session_scope(engine) as session:
        result = session.execute(update(Run).where(Run.id == run_id).values(**values))
        if result.rowcount == 0:
            raise LookupError(f"no run with id {run_id}")

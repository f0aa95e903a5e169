"""What the dashboard reads and writes beyond ``db.store``: the run table (a page at a time), its filter
choices, the runs a comparison needs, their single-device baselines, and the user's tags and notes.

Lists read only the columns they show: the run's own columns, its figures (kept on the run as its epochs
are written) and single config fields by JSON path (``batch_size``, ``epochs``, ``devices``), never whole
config blobs or epochs, so the Runs page stays quick with 100,000 runs: it filters, sorts, counts and pages
in the database. Like ``db.store``, every function returns plain dicts and lists.

    page = run_page(engine, RunFilters(statuses=("completed",), where="lr > 0.01"), sort="best_val_acc")
    more = run_page(engine, filters, sort="best_val_acc", after=page.next_after)
    set_tags(engine, page.rows[0]["id"], ["baseline", "fp32"])
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Text, and_, cast, func, or_, select, update

from contract.strategy_specs import baseline
from db import run_filters
from db.connection import session_scope
from db.store import parse_id
from db.tables import Run

# What makes two runs the same work: a speedup is only meaningful between runs that agree on these.
LIKE_FOR_LIKE_FIELDS = ("dataset", "model", "batch_size", "image_size", "amp")
PAGE_ROWS = 50
# Each order of the Runs table: (the column, newest/largest first). Runs without the figure come last.
SORTS = {"newest": (Run.created_at, True), "oldest": (Run.created_at, False), "best_val_acc": (Run.best_val_acc, True),
         "images_per_s": (Run.images_per_s, True), "training_time_s": (Run.training_time_s, True)}
Cursor = tuple[Any, int]  # the sort value and id of the last row of a page: the next page starts after it


@dataclass(frozen=True)
class RunFilters:
    """Keep runs matching every non-empty filter (any of the values listed for it), the ``where`` filter
    (``db.run_filters``: "lr > 0.01 and strategy = ddp") and the ``text`` search (in the run's model,
    strategy, dataset, tags and note, any case; "#12" or "12" finds run 12 too)."""

    statuses: tuple[str, ...] = ()
    strategies: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()  # "launched" (by Parallax) or "script" (import parallax)
    where: str = ""
    text: str = ""


@dataclass(frozen=True)
class RunPage:
    """One page of the run table: its rows (``run_table``'s), how many runs match in all, and the cursor of
    the next page (None on the last)."""

    rows: list[dict[str, Any]]
    matching: int
    next_after: Cursor | None


def run_page(engine: Engine, filters: RunFilters = RunFilters(), *, sort: str = "newest", after: Cursor | None = None,
             limit: int | None = PAGE_ROWS, count: bool = True) -> RunPage:
    """The runs matching ``filters`` in ``sort`` order (``SORTS``), ``limit`` of them after ``after`` (a keyset
    page: the database seeks to it, whatever the page's number), with how many match in all (``count``).

    Filtering, sorting and paging happen in the database on the run rows alone (their figures are kept on
    them, ``store.log_epoch``): a page of 100,000 runs reads ``limit`` rows. ValueError, in one line, for a
    malformed ``where`` or an unknown sort."""
    if sort not in SORTS:
        raise ValueError(f"unknown sort {sort!r}; allowed: {', '.join(SORTS)}")
    column, descending = SORTS[sort]
    matching = _matching(filters, engine.dialect.name)
    order = [column.desc().nulls_last(), Run.id.desc()] if descending else [column.asc().nulls_last(), Run.id.asc()]
    statement = select(*TABLE_COLUMNS).where(*matching).order_by(*order)
    if after is not None:
        statement = statement.where(_after(column, descending, after))
    if limit is not None:
        statement = statement.limit(limit + 1)  # one more: is there a next page?
    with session_scope(engine) as session:
        rows = [row._asdict() for row in session.execute(statement)]
        total = session.scalar(select(func.count()).select_from(Run).where(*matching)) if count else -1
    more = limit is not None and len(rows) > limit
    rows = rows[:limit] if limit is not None else rows
    next_after = (rows[-1][SORT_VALUE_KEYS[sort]], rows[-1]["id"]) if more else None
    return RunPage([_shaped(row) for row in rows], int(total), next_after)


def run_table(engine: Engine, filters: RunFilters = RunFilters()) -> list[dict[str, Any]]:
    """Every run matching ``filters``, newest first: one dict per run with its figures.

    Keys: id, status, kind, strategy, model, dataset, devices, batch_size, accumulate_steps, effective_batch, epochs,
    epochs_done, best_val_acc, mean_images_per_s (``run_figures``' images_per_s: over the epochs after the
    first), train_time_s (training steps only), epochs_time_s (with validation), tags, user_note,
    created_at, finished_at, summary (a script's run.summary). The figures are ``db.run_figures``', kept on the
    run as its epochs are written."""
    return run_page(engine, filters, limit=None, count=False).rows


TABLE_COLUMNS = (
    Run.id, Run.status, Run.strategy, Run.model, Run.dataset,
    Run.config["devices"].label("devices"),
    Run.config["batch_size"].as_integer().label("batch_size"),
    Run.config["accumulate_steps"].as_integer().label("accumulate_steps"),
    Run.config["epochs"].as_integer().label("epochs"),
    Run.tags, Run.user_note, Run.created_at, Run.finished_at, Run.kind, Run.epochs_done, Run.best_val_acc,
    Run.images_per_s.label("mean_images_per_s"), Run.training_time_s.label("train_time_s"), Run.epochs_time_s,
    Run.summary,
)
SORT_VALUE_KEYS = {"newest": "created_at", "oldest": "created_at", "best_val_acc": "best_val_acc",
                   "images_per_s": "mean_images_per_s", "training_time_s": "train_time_s"}


def _matching(filters: RunFilters, dialect: str) -> list:
    matching = run_filters.conditions(filters.where, dialect)
    for column, wanted in ((Run.status, filters.statuses), (Run.strategy, filters.strategies),
                           (Run.model, filters.models), (Run.dataset, filters.datasets), (Run.kind, filters.kinds)):
        if wanted:
            matching.append(column.in_(wanted))
    if filters.tags:
        matching.append(run_filters.tagged(filters.tags))
    if text := filters.text.strip():
        pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        found = [column.ilike(pattern, escape="\\") for column in (Run.model, Run.strategy, Run.dataset, Run.user_note)]
        found.append(cast(Run.tags, Text).ilike(pattern, escape="\\"))
        if (number := parse_id(text.removeprefix("#"))) is not None:
            found.append(Run.id == number)
        matching.append(or_(*found))
    return matching


def _after(column, descending: bool, cursor: Cursor):
    """Rows after ``cursor`` in the order ``column`` (NULLs last), then id."""
    value, run_id = cursor
    if value is None:
        return and_(column.is_(None), Run.id < run_id if descending else Run.id > run_id)
    beyond = column < value if descending else column > value
    tie = and_(column == value, Run.id < run_id if descending else Run.id > run_id)
    return or_(beyond, tie, column.is_(None))


def _shaped(row: dict[str, Any]) -> dict[str, Any]:
    # A script's config may name its devices as it likes ("cuda:0", ["cpu", "cpu"]).
    devices = row["devices"] or []
    row["devices"] = [str(device) for device in devices] if isinstance(devices, list) else [str(devices)]
    row["tags"] = list(row["tags"] or [])
    row["summary"] = dict(row["summary"] or {})
    row["epochs_done"] = row["epochs_done"] or 0
    # Runs recorded before gradient accumulation existed stepped once per batch.
    row["accumulate_steps"] = row["accumulate_steps"] or 1
    row["effective_batch"] = None if row["batch_size"] is None else row["batch_size"] * row["accumulate_steps"]
    return row


def run_statuses(engine: Engine, run_ids: Iterable[int]) -> dict[int, str]:
    """{run id: status} of the runs that exist among ``run_ids`` (picked on any page of the table)."""
    run_ids = list(dict.fromkeys(int(i) for i in run_ids))
    if not run_ids:
        return {}
    with session_scope(engine) as session:
        return {row.id: row.status for row in session.execute(select(Run.id, Run.status).where(Run.id.in_(run_ids)))}


def filter_choices(engine: Engine) -> dict[str, list[str]]:
    """The values each run-table filter can take: statuses, strategies, models, datasets, tags, kinds."""
    with session_scope(engine) as session:
        choices = {
            name: sorted(session.scalars(select(column).distinct()))
            for name, column in (("statuses", Run.status), ("strategies", Run.strategy),
                                 ("models", Run.model), ("datasets", Run.dataset), ("kinds", Run.kind))
        }
        # Each distinct list once (JSON has no equality on PostgreSQL: as text), not every run's.
        tag_lists = session.scalars(select(cast(Run.tags, Text)).distinct())
        choices["tags"] = sorted({tag for tags in tag_lists for tag in (json.loads(tags) if tags else [])})
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

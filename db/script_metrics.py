"""Runs of users' own scripts (``import parallax``) and the values they log.

A script run is a row of ``runs`` with ``kind = "script"``: its config is the script's own (any keys), its
strategy, model and dataset come from that config where it names them ("script", the run's name and "" where
not). ``elastic_run_id`` holds the key its processes find it by (``script:<key>``): the ``id`` the script gave,
or the key its ranks share. Each name it logs is a row of ``script_series``; its values are packed in
``script_chunks`` (``db.point_chunks``), a row per block of steps written together, each with its count,
minimum, maximum and last value. A chart reads those summaries: a million steps are a few thousand rows,
reduced in the database to buckets of minimum, maximum and last value.

    run_id = create_script_run(engine, name="baseline", project="resnet", config={"lr": 1e-3}, key="script:x")
    add_points(engine, run_id, [("train/loss", 1, 0.4, 2.31), ...])
    read_points(engine, [run_id])    # [{"run_id", "name", "step", "t_s", "value", "min", "max", "n", ...}, ...]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, and_, bindparam, case, func, insert, select, update
from sqlalchemy.orm import aliased

from db import point_chunks
from db.connection import session_scope
from db.point_chunks import BLOCK_STEPS
from db.recorded_by import VERSION_KEY, parallax_version
from db.run_figures import RunFigures, script_run_figures, shared_name
from db.tables import Run, ScriptChunk, ScriptSeries, utcnow

SCRIPT_KIND = "script"
SCRIPT_STRATEGY = "script"  # the strategy column of a script run whose config names none
POINT_FIELDS = ("name", "step", "t_s", "value")
MAX_NAME_LENGTH = 255
DEFAULT_MAX_POINTS = 1000  # buckets per series: about two points per pixel column of a chart half a screen wide
# Names looked up in one statement (SQLite takes up to 32,766 parameters; PostgreSQL 65,535).
NAMES_PER_QUERY = 500
# measurements[LOG_WAIT_KEY]: {"waited_s", "waits"}: how long parallax.log waited for the database to take
# what the script logged (back-pressure), so that a run slowed by its logging says so.
LOG_WAIT_KEY = "log_wait"


def create_script_run(engine: Engine, *, name: str, project: str, config: Mapping[str, Any], key: str,
                      tags: Sequence[str] = (), world_size: int = 1, script: Mapping[str, Any] | None = None,
                      status: str = "running", created_at: datetime | None = None) -> int:
    """Insert a script run and return its id; ``script`` (its file, project, name ...) goes to
    ``measurements["script"]``. ``created_at``: when it started, where that was not now (an offline run)."""
    run = script_run_row(name=name, project=project, config=config, key=key, tags=tags, world_size=world_size,
                         script=script, status=status, created_at=created_at)
    with session_scope(engine) as session:
        session.add(run)
        session.flush()
        return run.id


def script_run_row(*, name: str, project: str, config: Mapping[str, Any], key: str, tags: Sequence[str] = (),
                   world_size: int = 1, script: Mapping[str, Any] | None = None, status: str = "running",
                   created_at: datetime | None = None) -> Run:
    """The row ``create_script_run`` inserts, for a caller that inserts it in a transaction of its own."""
    now = created_at or utcnow()
    return Run(
        created_at=now, started_at=now, heartbeat_at=now, status=status, kind=SCRIPT_KIND,
        strategy=str(config.get("strategy") or SCRIPT_STRATEGY)[:64],
        model=str(config.get("model") or name or project)[:128],
        dataset=str(config.get("dataset") or ""),
        config=dict(config), notes=[], tags=list(dict.fromkeys(str(tag) for tag in tags)), user_note="",
        world_size=world_size, elastic_run_id=key,
        measurements={VERSION_KEY: parallax_version(), "script": {"project": project, "name": name, **(script or {})}},
    )


def find_script_run(engine: Engine, key: str) -> dict[str, Any] | None:
    """The newest script run with ``key``: id, status, started_at, heartbeat_at, config and measurements; None
    for none."""
    statement = (select(Run.id, Run.status, Run.started_at, Run.heartbeat_at, Run.config, Run.measurements)
                 .where(Run.elastic_run_id == key, Run.kind == SCRIPT_KIND).order_by(Run.id.desc()).limit(1))
    with session_scope(engine) as session:
        row = session.execute(statement).one_or_none()
    return None if row is None else row._asdict()


def reopen_script_run(engine: Engine, run_id: int) -> bool:
    """An ended script run back to running, to log on (``resume="allow"`` or "must"); False if it is running."""
    with session_scope(engine) as session:
        return session.execute(
            update(Run).where(Run.id == run_id, Run.status != "running")
            .values(status="running", error=None, finished_at=None, heartbeat_at=utcnow())
        ).rowcount == 1


def set_script_key(engine: Engine, run_id: int, *, key: str, group: str, world_size: int) -> None:
    """A resumed run takes the key and rank group of the job that resumes it (its ranks find it by them)."""
    with session_scope(engine) as session:
        measurements = session.scalar(select(Run.measurements).where(Run.id == run_id)) or {}
        script = {**measurements.get("script", {}), "group": group}
        session.execute(update(Run).where(Run.id == run_id).values(
            elastic_run_id=key, world_size=world_size, measurements={**measurements, "script": script}))


def update_script_config(engine: Engine, run_id: int, config: Mapping[str, Any]) -> None:
    """The script changed ``run.config``: the whole config again, and the columns copied from it."""
    values: dict[str, Any] = {"config": dict(config)}
    for column, width in (("strategy", 64), ("model", 128)):
        if config.get(column):
            values[column] = str(config[column])[:width]
    if config.get("dataset"):
        values["dataset"] = str(config["dataset"])
    with session_scope(engine) as session:
        session.execute(update(Run).where(Run.id == run_id).values(**values))



Columns = tuple[Sequence[int], Sequence[float], Sequence[float | None]]  # (steps, t_s, values) of one name


def add_points(engine: Engine, run_id: int, points: Iterable[Sequence[Any]]) -> int:
    """Append (name, step, t_s, value) points; returns how many. NaN and infinities are kept (a chart marks
    them; an export writes them as null)."""
    columns: dict[str, tuple[list, list, list]] = {}
    for name, step, t_s, value in points:
        column = columns.setdefault(str(name), ([], [], []))
        column[0].append(int(step))
        column[1].append(float(t_s))
        column[2].append(value)
    return add_columns(engine, run_id, columns)


def add_columns(engine: Engine, run_id: int, columns: Mapping[str, Columns], *,
                series_ids: dict[str, int] | None = None) -> int:
    """Append each name's (steps, t_s, values) in one transaction; returns how many values. ``series_ids``: a
    cache of {name: series id} for this run that a writer keeps from one batch to the next (filled here once
    the values are stored)."""
    known = dict(series_ids or {})
    with engine.begin() as connection:
        added = add_columns_on(connection, run_id, columns, known)
    if series_ids is not None:
        series_ids.update(known)
    return added


def add_columns_on(connection: Connection, run_id: int, columns: Mapping[str, Columns],
                   series_ids: dict[str, int] | None = None) -> int:
    """``add_columns`` within the caller's transaction (``parallax sync`` imports a whole file in one);
    ``series_ids`` is filled with the series it found or made."""
    merged: dict[str, tuple[list, list, list]] = {}
    for name, (steps, t_s, values) in columns.items():
        if len(steps):  # names longer than a column holds are cut, as every name of the run is
            column = merged.setdefault(str(name)[:MAX_NAME_LENGTH], ([], [], []))
            column[0].extend(steps)
            column[1].extend(t_s)
            column[2].extend(values)
    if not merged:
        return 0
    known = series_ids if series_ids is not None else {}
    chunks, counts = [], []
    ids = _series_ids(connection, run_id, list(merged), known)
    for name, (steps, t_s, values) in merged.items():
        rows = point_chunks.pack(steps, t_s, values)
        for row in rows:
            row["series_id"] = ids[name]
        chunks += rows
        counts.append({"series": ids[name], "added": len(steps), "top": max(row["last_step"] for row in rows)})
    connection.execute(insert(ScriptChunk.__table__), chunks)
    table = ScriptSeries.__table__
    connection.execute(
        update(table).where(table.c.id == bindparam("series")).values(
            points=table.c.points + bindparam("added"),
            last_step=case((table.c.last_step.is_(None) | (table.c.last_step < bindparam("top")), bindparam("top")),
                           else_=table.c.last_step)),
        counts)
    known.update(ids)
    if any(shared_name(name) is not None for name in merged):  # val/acc, throughput...: the run's figures move
        keep_script_figures(connection, run_id)
    return sum(len(column[0]) for column in merged.values())


def _series_ids(connection: Connection, run_id: int, names: list[str], known: dict[str, int]) -> dict[str, int]:
    """{name: series id} of the run's ``names``, the missing series made."""
    ids = {name: known[name] for name in names if name in known}
    for attempt in range(2):
        missing = [name for name in names if name not in ids]
        for start in range(0, len(missing), NAMES_PER_QUERY):
            part = missing[start:start + NAMES_PER_QUERY]
            ids.update({name: series_id for series_id, name in connection.execute(
                select(ScriptSeries.id, ScriptSeries.name).where(ScriptSeries.run_id == run_id,
                                                                 ScriptSeries.name.in_(part)))})
        missing = [name for name in names if name not in ids]
        if not missing or attempt:
            break
        connection.execute(insert(ScriptSeries.__table__), [{"run_id": run_id, "name": name, "points": 0}
                                                            for name in missing])
    return ids


def last_logged_step(engine: Engine, run_id: int) -> int | None:
    """The highest step the run has logged, None for none: a resumed script counts on from it."""
    with session_scope(engine) as session:
        return session.scalar(select(func.max(ScriptSeries.last_step)).where(ScriptSeries.run_id == run_id))


def metric_names(engine: Engine, run_ids: Iterable[int]) -> dict[int, list[str]]:
    """Each run's logged metric names, sorted."""
    run_ids = list(dict.fromkeys(run_ids))
    found: dict[int, list[str]] = {run_id: [] for run_id in run_ids}
    if run_ids:
        statement = (select(ScriptSeries.run_id, ScriptSeries.name).where(ScriptSeries.run_id.in_(run_ids))
                     .order_by(ScriptSeries.run_id, ScriptSeries.name))
        with session_scope(engine) as session:
            for run_id, name in session.execute(statement):
                found[run_id].append(name)
    return found


def run_metric_names(engine: Engine, run_id: int) -> list[str]:
    """The run's logged metric names, sorted, each once: one row per name (``script_series``), never a read of
    its values, so a run of 10,000 metrics lists them as quickly as its names take to send."""
    with session_scope(engine) as session:
        return list(session.scalars(select(ScriptSeries.name).where(ScriptSeries.run_id == run_id)
                                    .order_by(ScriptSeries.name)))


def metric_count(engine: Engine, run_id: int) -> int:
    """How many names the run has logged (one index count): a live page's check for a new one."""
    with session_scope(engine) as session:
        return int(session.scalar(select(func.count()).select_from(ScriptSeries).where(ScriptSeries.run_id == run_id)))


def run_figures_of(engine: Engine, run_ids: Iterable[int]) -> dict[int, tuple[RunFigures, dict[str, Any]]]:
    """Each script run's figures in the fields every run shares (``db.run_figures.script_run_figures``), and its
    summary (``run.summary``: the last value of each metric, and what the script set) for columns of their own.
    Reads the summary by JSON path, and of the logged series only those that map onto a shared one, from their
    chunks' summaries (maximum, sum and count of the finite values): no value is unpacked."""
    run_ids = list(dict.fromkeys(run_ids))
    if not run_ids:
        return {}
    with session_scope(engine) as session:
        return _figures_of(session.connection(), run_ids)


def _figures_of(connection: Connection, run_ids: list[int]) -> dict[int, tuple[RunFigures, dict[str, Any]]]:
    logged: dict[int, dict[str, dict[str, float]]] = {run_id: {} for run_id in run_ids}
    summaries = dict(connection.execute(select(Run.id, Run.measurements["summary"]).where(Run.id.in_(run_ids))).all())
    series = connection.execute(select(ScriptSeries.id, ScriptSeries.run_id, ScriptSeries.name)
                                .where(ScriptSeries.run_id.in_(run_ids))).all()
    mapped = {series_id: (run_id, shared) for series_id, run_id, name in series
              if (shared := shared_name(name)) is not None}
    if mapped:
        statement = (select(ScriptChunk.series_id, func.max(ScriptChunk.max_value), func.sum(ScriptChunk.total_value),
                            func.sum(ScriptChunk.finite))
                     .where(ScriptChunk.series_id.in_(list(mapped))).group_by(ScriptChunk.series_id)
                     .order_by(ScriptChunk.series_id))
        for series_id, highest, total, finite in connection.execute(statement):
            run_id, shared = mapped[series_id]
            if highest is not None and finite:  # the first series of a run under one shared name counts
                logged[run_id].setdefault(shared, {"max": float(highest), "mean": float(total) / int(finite)})
    found = {}
    for run_id in run_ids:
        summary = summaries.get(run_id) if isinstance(summaries.get(run_id), dict) else {}
        found[run_id] = (script_run_figures(summary, logged[run_id]), summary)
    return found


def keep_script_figures(connection: Connection, run_id: int) -> None:
    """Put a script run's figures on its row (``Run.best_val_acc``, ``images_per_s`` ...), where the Runs page
    sorts, filters and shows every run's: whenever it writes values under a shared name (``add_columns_on``)
    or its summary (``store.set_measurements``), in the same transaction."""
    figures, summary = _figures_of(connection, [run_id])[run_id]
    connection.execute(update(Run).where(Run.id == run_id).values(
        best_val_acc=figures.best_val_acc, images_per_s=figures.images_per_s, training_time_s=figures.training_time_s,
        epochs_time_s=figures.epochs_time_s, summary=summary))


def points_logged(engine: Engine, run_id: int) -> int:
    """How many values the run has stored: it grows with every batch written, for a live page's tick (one row
    per name read)."""
    with session_scope(engine) as session:
        return int(session.scalar(select(func.sum(ScriptSeries.points)).where(ScriptSeries.run_id == run_id)) or 0)


def read_points(engine: Engine, run_ids: Iterable[int], *, names: Iterable[str] | None = None,
                max_points: int | None = DEFAULT_MAX_POINTS, first_step: int | None = None,
                last_step: int | None = None) -> list[dict[str, Any]]:
    """The runs' values by run, name and step, between ``first_step`` and ``last_step`` where given.

    ``max_points=None``: every value (run_id, name, step, t_s, value, n = 1; null for NaN and infinities).
    Otherwise each series comes back in at most about ``max_points`` buckets of equal step width: each
    bucket's last value at its last step and time (``step``, ``t_s``, ``value``), its minimum and maximum
    (``min``, ``max``, over finite values), how many values it holds (``n``) and how many of those are NaN or
    infinite (``nonfinite``), so that a one-step spike or a NaN is never averaged away. A window holding no
    more than ``max_points`` values comes back whole (each its own bucket): a chart zoomed in that far
    shows every value. Buckets wider than a block are summed from the chunks' summaries in the database; a
    bucket at the window's edge may reach to the ends of its edge blocks."""
    if max_points is not None and (not isinstance(max_points, int) or isinstance(max_points, bool) or max_points < 2):
        raise ValueError(f"max_points must be a whole number of 2 or more, or None for every point; got {max_points!r}")
    wanted = None if names is None else list(names)
    rows: list[dict[str, Any]] = []
    with engine.connect() as connection:
        for series in _series_of(connection, list(dict.fromkeys(run_ids)), wanted):
            head = {"run_id": series.run_id, "name": series.name}
            rows += [{**head, **row} for row in _read_series(connection, series.id, max_points, first_step, last_step)]
    return rows


def _series_of(connection: Connection, run_ids: list[int], wanted: list[str] | None) -> list[Any]:
    if not run_ids:
        return []
    statement = (select(ScriptSeries.id, ScriptSeries.run_id, ScriptSeries.name, ScriptSeries.last_step)
                 .where(ScriptSeries.run_id.in_(run_ids)))
    if wanted is None:
        found = list(connection.execute(statement))
    else:  # the few a page draws, looked up by the (run, name) index, not picked from every name of a wide run
        found = [row for start in range(0, len(wanted), NAMES_PER_QUERY)
                 for row in connection.execute(statement.where(ScriptSeries.name.in_(wanted[start:start + NAMES_PER_QUERY])))]
    order = {run_id: index for index, run_id in enumerate(run_ids)}
    return sorted(found, key=lambda row: (order[row.run_id], row.name))


def _read_series(connection: Connection, series_id: int, max_points: int | None, first_step: int | None,
                 last_step: int | None) -> list[dict[str, Any]]:
    inside = [ScriptChunk.series_id == series_id]
    if first_step is not None:
        inside += [ScriptChunk.block >= first_step // BLOCK_STEPS, ScriptChunk.last_step >= first_step]
    if last_step is not None:
        inside += [ScriptChunk.block <= last_step // BLOCK_STEPS, ScriptChunk.first_step <= last_step]
    held, lowest, highest = connection.execute(
        select(func.sum(ScriptChunk.points), func.min(ScriptChunk.first_step), func.max(ScriptChunk.last_step))
        .where(*inside)).one()
    if not held:
        return []
    low = lowest if first_step is None else max(first_step, lowest)
    high = highest if last_step is None else min(last_step, highest)
    if max_points is None or held <= max_points:
        steps, t_s, values = _unpacked(connection, inside, low, high)
        if max_points is None:
            return [{"step": step, "t_s": at, "value": value if value == value and abs(value) != float("inf") else None,
                     "n": 1} for step, at, value in zip(steps.tolist(), t_s.tolist(), values.tolist())]
        return point_chunks.reduce_window(steps, t_s, values, first_step=low, width=1)
    width = -(-(high - low + 1) // max_points)  # ceil: at most max_points buckets
    if width < BLOCK_STEPS:  # few enough values to unpack: at most max_points blocks' worth
        steps, t_s, values = _unpacked(connection, inside, low, high)
        return point_chunks.reduce_window(steps, t_s, values, first_step=low, width=width)
    return _summed(connection, series_id, inside, low // BLOCK_STEPS, -(-width // BLOCK_STEPS))


def _unpacked(connection: Connection, inside: list, low: int, high: int):
    statement = (select(ScriptChunk.first_step, ScriptChunk.steps, ScriptChunk.t_s, ScriptChunk.values)
                 .where(*inside).order_by(ScriptChunk.id))
    return point_chunks.unpack_all([row._mapping for row in connection.execute(statement)], low, high)


def _summed(connection: Connection, series_id: int, inside: list, first_block: int, blocks_per_bucket: int
            ) -> list[dict[str, Any]]:
    """Buckets of ``blocks_per_bucket`` blocks from ``first_block``, from the chunks' summaries: the database
    reduces them, and each bucket's last value is read from its last chunk (one index seek)."""
    bucket = ((ScriptChunk.block - first_block) // blocks_per_bucket).label("bucket")
    grouped = (select(bucket, func.min(ScriptChunk.min_value).label("low"), func.max(ScriptChunk.max_value).label("high"),
                      func.sum(ScriptChunk.points).label("n"), func.sum(ScriptChunk.finite).label("finite"),
                      func.max(ScriptChunk.last_step).label("last_step"))
               .where(*inside).group_by(bucket).subquery())
    last = aliased(ScriptChunk)
    statement = (select(grouped, last.last_value, last.last_t_s)
                 .join(last, and_(last.series_id == series_id, last.block == grouped.c.last_step // BLOCK_STEPS,
                                  last.last_step == grouped.c.last_step))
                 .order_by(grouped.c.bucket, last.id))
    buckets: dict[int, dict[str, Any]] = {}
    for row in connection.execute(statement):  # equal last steps in two chunks: the later chunk's value
        buckets[row.bucket] = {"step": int(row.last_step), "t_s": row.last_t_s, "value": row.last_value,
                               "min": row.low, "max": row.high, "n": int(row.n), "nonfinite": int(row.n - row.finite)}
    return list(buckets.values())


def read_points_after(engine: Engine, run_id: int, after: Mapping[str, int], *, limit: int) -> dict[str, dict[str, list]]:
    """Each named series' values after its own step in ``after`` ({name: step}), in step order, as columns
    (``step``, ``t_s``, ``value``: null for NaN and infinities; ``more``: whether it holds values past those
    sent), for a live chart that holds every step up to
    there. At most about ``limit`` values a name (every value of the last step taken, so that the next ask,
    after it, misses none); the rest at the next ask. The chunks are picked by their block and last step from
    the index, so the cost is that of the new values, however long the series; values are chosen by step,
    never by chunk, so a block written again in a chunk of its own is never sent twice. Names the run has not
    logged are left out."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be a whole number of 1 or more; got {limit!r}")
    found: dict[str, dict[str, list]] = {}
    with engine.connect() as connection:
        for series in _series_of(connection, [run_id], list(after)):
            steps, t_s, values = _values_after(connection, series.id, int(after[series.name]), limit)
            sent = int(steps[-1]) if len(steps) else int(after[series.name])
            found[series.name] = {"step": steps.tolist(), "t_s": t_s.tolist(),
                                  "value": [value if math.isfinite(value) else None for value in values.tolist()],
                                  "more": series.last_step is not None and series.last_step > sent}
    return found


def _values_after(connection: Connection, series_id: int, after: int, limit: int):
    newer = [ScriptChunk.series_id == series_id, ScriptChunk.block >= after // BLOCK_STEPS,
             ScriptChunk.last_step > after]
    # The first blocks that hold ``limit`` values or more (each block holds at least one): read from the index.
    blocks = connection.execute(select(ScriptChunk.block, func.sum(ScriptChunk.points)).where(*newer)
                                .group_by(ScriptChunk.block).order_by(ScriptChunk.block).limit(limit)).all()
    if not blocks:
        return point_chunks.unpack_all([])
    held, last_block = 0, blocks[-1][0]
    for block, points in blocks:
        held += int(points)
        if held >= limit:
            last_block = block
            break
    statement = (select(ScriptChunk.first_step, ScriptChunk.steps, ScriptChunk.t_s, ScriptChunk.values)
                 .where(*newer, ScriptChunk.block <= last_block).order_by(ScriptChunk.id))
    steps, t_s, values = point_chunks.unpack_all([row._mapping for row in connection.execute(statement)], after + 1)
    if len(steps) > limit:  # cut after a whole step: the next ask starts after it
        keep = int(np.searchsorted(steps, steps[limit - 1], side="right"))
        steps, t_s, values = steps[:keep], t_s[:keep], values[:keep]
    return steps, t_s, values


def run_status(engine: Engine, run_id: int) -> str | None:
    """The run's status, None for no such run: a live chart's one read of the run row."""
    with session_scope(engine) as session:
        return session.scalar(select(Run.status).where(Run.id == run_id))

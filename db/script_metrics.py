"""Runs of users' own scripts (``import parallax``) and the values they log.

A script run is a row of ``runs`` with ``kind = "script"``: its config is the script's own (any keys), its
strategy, model and dataset come from that config where it names them ("script", the run's name and "" where
not). ``elastic_run_id`` holds the key its processes find it by (``script:<key>``): the ``id`` the script gave,
or the key its ranks share. What it logs are rows of ``script_metrics``: (name, step, t_s, value).

    run_id = create_script_run(engine, name="baseline", project="resnet", config={"lr": 1e-3}, key="script:x")
    add_points(engine, run_id, [("train/loss", 1, 0.4, 2.31), ...])
    read_points(engine, [run_id])    # [{"run_id", "name", "step", "t_s", "value", "n"}, ...]
"""

from __future__ import annotations

import math
from datetime import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.orm import Session

from db.connection import session_scope
from db.tables import Run, ScriptMetric, utcnow
from db.recorded_by import VERSION_KEY, parallax_version

SCRIPT_KIND = "script"
SCRIPT_STRATEGY = "script"  # the strategy column of a script run whose config names none
POINT_FIELDS = ("name", "step", "t_s", "value")
MAX_NAME_LENGTH = 255
DEFAULT_MAX_POINTS = 2000


def create_script_run(engine: Engine, *, name: str, project: str, config: Mapping[str, Any], key: str,
                      tags: Sequence[str] = (), world_size: int = 1, script: Mapping[str, Any] | None = None,
                      status: str = "running", created_at: datetime | None = None) -> int:
    """Insert a script run and return its id; ``script`` (its file, project, name ...) goes to
    ``measurements["script"]``. ``created_at``: when it started, where that was not now (an offline run)."""
    now = created_at or utcnow()
    run = Run(
        created_at=now, started_at=now, heartbeat_at=now, status=status, kind=SCRIPT_KIND,
        strategy=str(config.get("strategy") or SCRIPT_STRATEGY)[:64],
        model=str(config.get("model") or name or project)[:128],
        dataset=str(config.get("dataset") or ""),
        config=dict(config), notes=[], tags=list(dict.fromkeys(str(tag) for tag in tags)), user_note="",
        world_size=world_size, elastic_run_id=key,
        measurements={VERSION_KEY: parallax_version(), "script": {"project": project, "name": name, **(script or {})}},
    )
    with session_scope(engine) as session:
        session.add(run)
        session.flush()
        return run.id


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


def add_points(engine: Engine, run_id: int, points: Iterable[Sequence[Any]]) -> int:
    """Append (name, step, t_s, value) points in one statement; returns how many. NaN and infinities are
    stored as NULL (PostgreSQL's float takes them, SQLite's JSON and some drivers do not): a gap in the chart."""
    values = [{"run_id": run_id, "name": str(name)[:MAX_NAME_LENGTH], "step": int(step), "t_s": float(t_s),
               "value": float(value) if value is not None and math.isfinite(value) else None}
              for name, step, t_s, value in points]
    if values:
        with session_scope(engine) as session:
            session.execute(insert(ScriptMetric), values)
    return len(values)


def last_logged_step(engine: Engine, run_id: int) -> int | None:
    """The highest step the run has logged, None for none: a resumed script counts on from it."""
    with session_scope(engine) as session:
        return session.scalar(select(func.max(ScriptMetric.step)).where(ScriptMetric.run_id == run_id))


def metric_names(engine: Engine, run_ids: Iterable[int]) -> dict[int, list[str]]:
    """Each run's logged metric names, sorted."""
    run_ids = list(dict.fromkeys(run_ids))
    found: dict[int, list[str]] = {run_id: [] for run_id in run_ids}
    if run_ids:
        statement = (select(ScriptMetric.run_id, ScriptMetric.name).where(ScriptMetric.run_id.in_(run_ids))
                     .distinct().order_by(ScriptMetric.run_id, ScriptMetric.name))
        with session_scope(engine) as session:
            for run_id, name in session.execute(statement):
                found[run_id].append(name)
    return found


def run_metric_names(engine: Engine, run_id: int) -> list[str]:
    """The run's logged metric names, sorted, each once, in time that grows with the number of names, not of
    points: one index seek per name (a recursive query stepping to the next name above the last), where
    ``SELECT DISTINCT`` reads every point of the run (a million-step run of 10,000 metrics holds billions)."""
    names = select(func.min(ScriptMetric.name).label("name")).where(ScriptMetric.run_id == run_id).cte(
        "names", recursive=True)
    above = names.alias("above")
    following = (select(func.min(ScriptMetric.name)).where(ScriptMetric.run_id == run_id, ScriptMetric.name > above.c.name)
                 .scalar_subquery())
    names = names.union_all(select(following.label("name")).where(above.c.name.is_not(None)))
    with session_scope(engine) as session:
        return list(session.scalars(select(names.c.name).where(names.c.name.is_not(None))))


def last_point_id(engine: Engine, run_id: int) -> int:
    """The id of the run's newest point (0 for none): it grows with every point, for a live page's tick."""
    with session_scope(engine) as session:
        return int(session.scalar(select(func.max(ScriptMetric.id)).where(ScriptMetric.run_id == run_id)) or 0)


def read_points(engine: Engine, run_ids: Iterable[int], *, names: Iterable[str] | None = None,
                max_points: int | None = DEFAULT_MAX_POINTS) -> list[dict[str, Any]]:
    """The runs' points (run_id, name, step, t_s, value, n) by run, name and step. A metric with more than
    ``max_points`` points comes back as the means of equal step buckets (``n`` points each, at the bucket's
    first step); ``max_points=None`` gives every point."""
    if max_points is not None and max_points < 2:
        raise ValueError(f"max_points must be 2 or more, or None for every point; got {max_points!r}")
    wanted = None if names is None else list(names)
    with session_scope(engine) as session:
        return [row for run_id in dict.fromkeys(run_ids)
                for name in _names_of(session, run_id, wanted)
                for row in _points_of(session, run_id, name, max_points)]


def _names_of(session: Session, run_id: int, wanted: list[str] | None) -> list[str]:
    statement = select(ScriptMetric.name).where(ScriptMetric.run_id == run_id).distinct().order_by(ScriptMetric.name)
    if wanted is not None:  # the few a page draws, looked up by the index, not picked from every name of the run
        statement = statement.where(ScriptMetric.name.in_(wanted))
    return list(session.scalars(statement))


def _points_of(session: Session, run_id: int, name: str, max_points: int | None) -> list[dict[str, Any]]:
    of = (ScriptMetric.run_id == run_id) & (ScriptMetric.name == name)
    count, first, last = session.execute(
        select(func.count(), func.min(ScriptMetric.step), func.max(ScriptMetric.step)).where(of)).one()
    if not count:
        return []
    if max_points is None or count <= max_points:
        statement = select(ScriptMetric.step, ScriptMetric.t_s, ScriptMetric.value).where(of).order_by(
            ScriptMetric.step, ScriptMetric.id)
        return [{"run_id": run_id, "name": name, **row._asdict(), "n": 1} for row in session.execute(statement)]
    width = -(-(last - first + 1) // max_points)
    bucket = (ScriptMetric.step - first) // width
    statement = (select(func.min(ScriptMetric.step).label("step"), func.min(ScriptMetric.t_s).label("t_s"),
                        func.avg(ScriptMetric.value).label("value"), func.count().label("n"))
                 .where(of).group_by(bucket).order_by(func.min(ScriptMetric.step)))
    return [{"run_id": run_id, "name": name, **row._asdict()} for row in session.execute(statement)]

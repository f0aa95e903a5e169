"""The per-step series of a run (``step_metrics``), and what a live page asks of it and of the run's system
samples (stored per metric by ``db.system_metrics``).

Rows arrive in batches (a few seconds' worth at a time), so a run writes a handful of
statements a minute whatever its step rate.

    add_steps(engine, run_id, [{"epoch": 1, "step": 1, "t_s": 0.8, "train_loss": 2.3,
                                "images_per_s": 410.0, "lr": 0.01}, ...])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Engine, and_, delete, func, insert, select
from sqlalchemy.orm import Session

from db.connection import lock_wait_at_most, session_scope
from db.system_metrics import GPU_FIELDS, PROCESS_FIELDS, samples_stored
from db.tables import Run, StepMetric, SystemSeries

STEP_FIELDS: tuple[str, ...] = ("epoch", "step", "t_s", "train_loss", "images_per_s", "lr")
# The step series a chart draws as a band from each bucket's minimum to its maximum.
BANDED_STEP_FIELDS: tuple[str, ...] = ("train_loss", "images_per_s")


def add_steps(engine: Engine, run_id: int, rows: Iterable[Mapping[str, Any]], *, lock_wait_s: float | None = None
              ) -> None:
    """Append step points (``STEP_FIELDS``) to the run in one statement; ``lock_wait_s``: how long that statement
    may wait for another process's lock (a write the training thread may skip), else the connection's own wait."""
    _add(engine, run_id, StepMetric, STEP_FIELDS, rows, lock_wait_s=lock_wait_s)


def forget_steps_from(engine: Engine, run_id: int, epoch: int, after_step: int = 0) -> None:
    """Remove the run's step points of ``epoch`` and later (past global step ``after_step``): a resumed run
    trains them again, and records each step once."""
    with session_scope(engine) as session:
        session.execute(delete(StepMetric).where(StepMetric.run_id == run_id, StepMetric.epoch >= epoch,
                                                 StepMetric.step > after_step))


def _add(engine: Engine, run_id: int, model: type, names: tuple[str, ...], rows: Iterable[Mapping[str, Any]], *,
         lock_wait_s: float | None = None) -> None:
    values = []
    for row in rows:
        unknown = sorted(set(row) - set(names))
        if unknown:  # a misspelt field would otherwise vanish from every chart
            raise ValueError(f"unknown {model.__tablename__} fields {unknown}; allowed: {', '.join(names)}")
        values.append({"run_id": run_id, **{name: row.get(name) for name in names if name in row}})
    if not values:
        return
    with engine.connect() as connection, lock_wait_at_most(connection, lock_wait_s):
        try:
            if connection.scalar(select(Run.id).where(Run.id == run_id)) is None:
                raise LookupError(f"no run with id {run_id}")
            connection.execute(insert(model), values)
            connection.commit()
        except BaseException:
            connection.rollback()  # before the connection's own lock wait is put back
            raise


# --- reads ---------------------------------------------------------------------------------

# Enough points for a chart as wide as a screen; a 100-hour run (360,000 samples, up to 720,000
# step points) comes back as this many rows whatever its length.
DEFAULT_MAX_POINTS = 2000


def read_steps(engine: Engine, run_ids: Iterable[int], *, max_points: int | None = DEFAULT_MAX_POINTS
               ) -> list[dict[str, Any]]:
    """The runs' step points (``run_id``, ``STEP_FIELDS`` and ``n``), by run then step.

    With ``max_points``, each row is a bucket (``n`` points; a run of no more than ``max_points``
    points comes back as buckets of one): the bucket's last point whole (its step, time, loss,
    images/s and learning rate), its first step (``first_step``: an epoch's first step keeps its
    place), and the minimum and maximum of its loss and images/s (``train_loss_min``,
    ``train_loss_max``, ``images_per_s_min``, ``images_per_s_max``), so that a one-step spike is
    drawn, never averaged away. Buckets are of equal step width and never cross an epoch's end
    (so at most ``max_points`` rows plus one per epoch). ``max_points=None`` gives every point
    (``STEP_FIELDS`` and ``n`` = 1)."""
    return _read_each(engine, run_ids, max_points, _read_steps_of)


def export_sample(row: Mapping[str, Any], host: str | None) -> dict[str, Any]:
    """A system sample as ``export`` writes it: its time, the name of the machine sampled (``host``,
    see ``sample_host``) and its node rank in the job (``node``: two machines may share a name), the
    host's figures, each process with ``PROCESS_FIELDS`` and each GPU with
    ``GPU_FIELDS`` in that order (null where not measured)."""
    return {
        "t_s": row["t_s"], "host": host, "node": row.get("node") or 0, "host_cpu_pct": row["host_cpu_pct"],
        "host_memory_mb": row["host_memory_mb"],
        "processes": [{name: process.get(name) for name in PROCESS_FIELDS} for process in row["processes"] or []],
        "gpus": [{name: gpu.get(name) for name in GPU_FIELDS} for gpu in row["gpus"] or []],
    }


def sample_host(node: int | None, hosts: list[str] | None, host: str | None) -> str | None:
    """The name of the machine a sample of node ``node`` is of: the run's ``hosts[node]`` for a run
    across machines (torchrun), else the run's ``host``."""
    if hosts and node is not None and 0 <= node < len(hosts):
        return hosts[node]
    return host


def last_step(engine: Engine, run_ids: Iterable[int]) -> dict[int, int]:
    """The last step recorded for each run (0 for none): one seek in the (run_id, step) index per
    run, whatever the run's length, so that a live page can ask it on every tick."""
    last = select(func.max(StepMetric.step)).where(StepMetric.run_id == Run.id).scalar_subquery()
    return _per_run(engine, run_ids, last)


def last_sample(engine: Engine, run_ids: Iterable[int]) -> dict[int, int]:
    """How many system values each run has stored (0 for none): it grows with every batch its sampler writes
    (``db.system_metrics.samples_stored``)."""
    return samples_stored(engine, run_ids)


def last_points(engine: Engine, run_id: int) -> tuple[int, int]:
    """``last_step`` and ``last_sample`` of one run in one query: what a live page asks every tick (one seek
    for the step, one row per system series of the run, never a value)."""
    step = select(func.max(StepMetric.step)).where(StepMetric.run_id == run_id).scalar_subquery()
    sample = select(func.sum(SystemSeries.points)).where(SystemSeries.run_id == run_id).scalar_subquery()
    with session_scope(engine) as session:
        found = session.execute(select(step, sample)).one()
    return int(found[0] or 0), int(found[1] or 0)


def read_steps_after(engine: Engine, run_id: int, after_step: int, *, limit: int) -> list[dict[str, Any]]:
    """The run's step points after step ``after_step`` (``STEP_FIELDS``), by step, at most ``limit``: one
    range seek in the (run_id, step) index, so that a live page can ask for what is new every second."""
    fields = [getattr(StepMetric, name) for name in STEP_FIELDS]
    statement = (select(*fields).where(StepMetric.run_id == run_id, StepMetric.step > after_step)
                 .order_by(StepMetric.step).limit(limit))
    with session_scope(engine) as session:
        return [row._asdict() for row in session.execute(statement)]


def live_state(engine: Engine, run_id: int) -> dict[str, Any] | None:
    """What a live page shows beside the new points, in one query: the run's status, its progress (epoch, step
    of total) and its last recorded step; None for no such run."""
    last = select(func.max(StepMetric.step)).where(StepMetric.run_id == run_id).scalar_subquery()
    statement = select(Run.status, Run.progress_epoch, Run.progress_step, Run.progress_total_steps,
                       last.label("last_step")).where(Run.id == run_id)
    with session_scope(engine) as session:
        row = session.execute(statement).one_or_none()
    if row is None:
        return None
    return {"status": row.status, "epoch": row.progress_epoch, "step": row.progress_step,
            "total_steps": row.progress_total_steps, "last_step": int(row.last_step or 0)}


def _read_each(engine: Engine, run_ids: Iterable[int], max_points: int | None, read_of) -> list[dict[str, Any]]:
    """``read_of(session, run_id, max_points)`` for each run (once each, in order), in one session."""
    _check_max_points(max_points)
    with session_scope(engine) as session:
        return [row for run_id in dict.fromkeys(run_ids) for row in read_of(session, run_id, max_points)]


def _check_max_points(max_points: int | None) -> None:
    whole = isinstance(max_points, int) and not isinstance(max_points, bool)
    if max_points is not None and not (whole and max_points >= 2):
        raise ValueError(f"max_points must be a whole number of 2 or more, or None for every row; got {max_points!r}")


def _per_run(engine: Engine, run_ids: Iterable[int], last: Any) -> dict[int, int]:
    run_ids = list(run_ids)
    found: dict[int, int] = {}
    if run_ids:
        with session_scope(engine) as session:
            statement = select(Run.id, last).where(Run.id.in_(run_ids))
            found = {run_id: value for run_id, value in session.execute(statement)}
    return {run_id: int(found.get(run_id) or 0) for run_id in run_ids}


def _read_steps_of(session: Session, run_id: int, max_points: int | None) -> list[dict[str, Any]]:
    of_run = StepMetric.run_id == run_id
    count, first, last = session.execute(
        select(func.count(), func.min(StepMetric.step), func.max(StepMetric.step)).where(of_run)).one()
    if not count:
        return []
    fields = [getattr(StepMetric, name) for name in STEP_FIELDS]
    if max_points is None or count <= max_points:
        statement = select(*fields).where(of_run).order_by(StepMetric.step)
        rows = [{"run_id": run_id, **row._asdict(), "n": 1} for row in session.execute(statement)]
        if max_points is not None:
            for row in rows:  # a point of its own is a bucket of one
                row.update(first_step=row["step"], **{f"{name}_{end}": row[name] for name in BANDED_STEP_FIELDS
                                                      for end in ("min", "max")})
        return rows
    width = -(-(last - first + 1) // max_points)  # ceil: at most max_points buckets of steps
    bucket = (StepMetric.step - first) // width  # integers: integer division on SQLite and PostgreSQL alike
    bands = [func.min(getattr(StepMetric, name)).label(f"{name}_min") for name in BANDED_STEP_FIELDS]
    bands += [func.max(getattr(StepMetric, name)).label(f"{name}_max") for name in BANDED_STEP_FIELDS]
    grouped = (select(func.min(StepMetric.step).label("first_step"),
                      func.max(StepMetric.step).label("last_step"), func.count().label("n"), *bands)
               .where(of_run).group_by(StepMetric.epoch, bucket).subquery())
    # Each bucket's last point is read whole ((run_id, step) is unique): its values, not a mean of the bucket.
    statement = (select(*fields, grouped.c.first_step, grouped.c.n,
                        *(grouped.c[f"{name}_{end}"] for name in BANDED_STEP_FIELDS for end in ("min", "max")))
                 .join(grouped, and_(StepMetric.run_id == run_id, StepMetric.step == grouped.c.last_step))
                 .order_by(StepMetric.step))
    return [{"run_id": run_id, **row._asdict()} for row in session.execute(statement)]

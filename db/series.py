"""The per-step and per-second series of a run: ``step_metrics`` and ``system_samples``.

Rows arrive in batches (a few seconds' worth at a time), so a run writes a handful of
statements a minute whatever its step rate.

    add_steps(engine, run_id, [{"epoch": 1, "step": 1, "t_s": 0.8, "train_loss": 2.3,
                                "images_per_s": 410.0, "lr": 0.01}, ...])
    add_system_samples(engine, run_id, [{"t_s": 1.0, "host_cpu_pct": 97.0, "host_memory_mb": 2210.0,
                                         "processes": [...], "gpus": [...]}, ...])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Engine, insert, select

from db.engine import session_scope
from db.models import Run, StepMetric, SystemSample

STEP_FIELDS: tuple[str, ...] = ("epoch", "step", "t_s", "train_loss", "images_per_s", "lr")
SYSTEM_FIELDS: tuple[str, ...] = ("t_s", "host_cpu_pct", "host_memory_mb", "processes", "gpus")


def add_steps(engine: Engine, run_id: int, rows: Iterable[Mapping[str, Any]]) -> None:
    """Append step points (``STEP_FIELDS``) to the run in one statement."""
    _add(engine, run_id, StepMetric, STEP_FIELDS, rows)


def add_system_samples(engine: Engine, run_id: int, rows: Iterable[Mapping[str, Any]]) -> None:
    """Append system samples (``SYSTEM_FIELDS``) to the run in one statement."""
    _add(engine, run_id, SystemSample, SYSTEM_FIELDS, rows)


def _add(engine: Engine, run_id: int, model: type, names: tuple[str, ...], rows: Iterable[Mapping[str, Any]]) -> None:
    values = []
    for row in rows:
        unknown = sorted(set(row) - set(names))
        if unknown:  # a misspelt field would otherwise vanish from every chart
            raise ValueError(f"unknown {model.__tablename__} fields {unknown}; allowed: {', '.join(names)}")
        values.append({"run_id": run_id, **{name: row.get(name) for name in names if name in row}})
    if not values:
        return
    with session_scope(engine) as session:
        if session.scalar(select(Run.id).where(Run.id == run_id)) is None:
            raise LookupError(f"no run with id {run_id}")
        session.execute(insert(model), values)

"""Read and write runs and their per-epoch metrics.

Every function takes the engine from ``db.make_engine()``, opens its own session scope and
returns plain dataclasses, dicts or lists: no ORM object leaves this module, so pages and
the trainer never hold a session. Functions given the id of a run that does not exist
raise ``LookupError``, except ``get_run``, which returns None.
"""

from __future__ import annotations

import operator
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Select, and_, delete, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from db import script_metrics, series, system_metrics
from db.connection import session_scope
from db.run_state import PROCESS_START_KEY, process_start
from db.recorded_by import VERSION_KEY, parallax_version
from db.tables import RUN_STATUSES, TERMINAL_STATUSES, EpochMetric, Run, Sweep, utcnow
from db.run_figures import run_figures

MAX_ID = 2**63 - 1  # ids are 64-bit signed integers in SQLite and PostgreSQL (BIGINT) alike


def parse_id(raw: Any) -> int | None:
    """The row id ``raw`` names (text such as "12" from a command line or an address), or None when it
    is not a whole number from 1 to MAX_ID: "²", "1e3" or a 30-digit number never reaches the database."""
    text = str(raw).strip()
    if not (text.isascii() and text.isdecimal()) or len(text) > len(str(MAX_ID)):
        return None
    value = int(text)
    return value if 1 <= value <= MAX_ID else None


EPOCH_FLOAT_FIELDS = (
    "train_loss",
    "train_acc",
    "val_loss",
    "val_acc",
    "epoch_time_s",
    "train_time_s",
    "images_per_s",
    "lr",
)
EPOCH_FIELDS = ("epoch", *EPOCH_FLOAT_FIELDS, "peak_memory_mb", "extra")
CONFIG_COLUMNS = ("strategy", "model", "dataset")


@dataclass(frozen=True)
class RunRecord:
    """Every column of one run."""

    id: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    status: str
    strategy: str
    model: str
    dataset: str
    config: dict[str, Any]
    error: str | None
    pid: int | None
    host: str | None
    world_size: int
    notes: list[str]
    tags: list[str]
    user_note: str
    progress_epoch: int | None
    progress_step: int | None
    progress_total_steps: int | None
    sweep_id: int | None
    nodes: int
    hosts: list[str]
    elastic_run_id: str | None
    measurements: dict[str, Any]
    kind: str = "launched"


@dataclass(frozen=True)
class RunSummary:
    """What the run list shows; reading it never loads the config blobs."""

    id: int
    status: str
    strategy: str
    model: str
    dataset: str
    created_at: datetime
    finished_at: datetime | None
    tags: list[str]
    kind: str = "launched"


def create_run(
    engine: Engine,
    config: Mapping[str, Any],
    *,
    status: str = "running",
    notes: list[str] | None = None,
    world_size: int = 1,
    sweep_id: int | None = None,
    search_trial: tuple[int, int] | None = None,
) -> int:
    """Insert a run for ``config`` (a RunConfig as a dict) and return its id.

    strategy, model, dataset and tags are copied from the config into their own columns; ``search_trial``,
    (search id, trial number), makes the run a trial of a search in the same write.
    """
    _check_status(status)
    missing = [key for key in CONFIG_COLUMNS if not config.get(key)]
    if missing:
        raise ValueError(f"config has no {', '.join(missing)}; a run needs {', '.join(CONFIG_COLUMNS)}")
    now = utcnow()
    run = Run(
        created_at=now,
        started_at=now if status == "running" else None,
        status=status,
        strategy=str(config["strategy"]),
        model=str(config["model"]),
        dataset=str(config["dataset"]),
        config=dict(config),
        notes=_unique(notes or []),
        tags=_unique(config.get("tags") or []),
        user_note="",
        world_size=world_size,
        sweep_id=sweep_id,
        search_id=search_trial[0] if search_trial else None,
        search_trial=search_trial[1] if search_trial else None,
        measurements={VERSION_KEY: parallax_version()},  # a database shared with other versions says whose run
    )
    with session_scope(engine) as session:
        session.add(run)
        session.flush()
        return run.id


def create_sweep(engine: Engine, config: Mapping[str, Any], strategies: list[str]) -> int:
    """Record a sweep: one config to be run under each of ``strategies``."""
    with session_scope(engine) as session:
        sweep = Sweep(created_at=utcnow(), config=dict(config), strategies=list(strategies))
        session.add(sweep)
        session.flush()
        return sweep.id


def sweep_run_ids(engine: Engine, sweep_id: int) -> list[int]:
    """The runs of a sweep, in launch order."""
    with session_scope(engine) as session:
        if session.get(Sweep, sweep_id) is None:
            raise LookupError(f"no sweep with id {sweep_id}")
        return list(session.scalars(select(Run.id).where(Run.sweep_id == sweep_id).order_by(Run.id)))


def later_sweep_runs(engine: Engine, sweep_id: int, *, models: Iterable[str],
                     datasets: Iterable[str]) -> list[dict[str, Any]]:
    """The completed runs of ``models`` on ``datasets`` in sweeps created after sweep ``sweep_id``,
    newest first, in one query: id, sweep_id, strategy, status, config."""
    this = select(Sweep.created_at).where(Sweep.id == sweep_id).scalar_subquery()
    statement = (
        select(Run.id, Run.sweep_id, Run.strategy, Run.status, Run.config)
        .join(Sweep, Run.sweep_id == Sweep.id)
        .where(Run.status == "completed", Run.model.in_(list(models)), Run.dataset.in_(list(datasets)),
               # Two sweeps stamped in the same microsecond are told apart by their ids.
               or_(Sweep.created_at > this, and_(Sweep.created_at == this, Sweep.id > sweep_id)))
        .order_by(Run.id.desc())
    )
    with session_scope(engine) as session:
        return [row._asdict() for row in session.execute(statement)]


def list_sweeps(engine: Engine) -> list[dict[str, Any]]:
    """Sweeps, newest first: id, created_at, strategies."""
    with session_scope(engine) as session:
        rows = session.execute(select(Sweep.id, Sweep.created_at, Sweep.strategies).order_by(Sweep.id.desc()))
        return [row._asdict() for row in rows]


def set_status(engine: Engine, run_id: int, status: str, *, error: str | None = None) -> None:
    """Move a run to ``status``, stamping started_at / finished_at; keeps any earlier error."""
    _check_status(status)
    now = utcnow()
    values: dict[str, Any] = {"status": status}
    if status in TERMINAL_STATUSES:
        values["finished_at"] = now
    if error is not None:
        values["error"] = error
    with session_scope(engine) as session:
        _update_run(session, run_id, **values)
        if status == "running":
            # A run started once keeps its first start time.
            session.execute(
                update(Run).where(Run.id == run_id, Run.started_at.is_(None)).values(started_at=now)
            )


def set_process(engine: Engine, run_id: int, *, pid: int, host: str) -> None:
    """Record which process (pid on host) executes the run, so it can be found and cancelled,
    and when that process started (``db.run_state.process_start``, called on ``host``): a pid is
    reused after its process ends, and a cancel must signal the run's own process, no other."""
    start = process_start(pid) if host == socket.gethostname() else None
    with session_scope(engine) as session:
        measurements = session.scalar(select(Run.measurements).where(Run.id == run_id))
        values: dict[str, Any] = {"pid": pid, "host": host}
        if measurements is not None:
            values["measurements"] = {**measurements, PROCESS_START_KEY: start}
        _update_run(session, run_id, **values)


def add_notes(engine: Engine, run_id: int, notes: Iterable[str]) -> None:
    """Append engine notes to the run, skipping ones it already has."""
    with session_scope(engine) as session:
        current = session.scalar(select(Run.notes).where(Run.id == run_id))
        if current is None:
            raise LookupError(f"no run with id {run_id}")
        merged = _unique([*current, *notes])
        if merged != current:
            _update_run(session, run_id, notes=merged)


def set_config(engine: Engine, run_id: int, config: Mapping[str, Any], *, world_size: int | None = None) -> None:
    """Replace the run's config with ``config``: the same training with what its launcher settled before the
    first rank started (``--amp auto``'s dtype), or a resumed run moved to other devices (``world_size``
    then changes too); nothing else may change it."""
    values = {"config": dict(config), **({"world_size": world_size} if world_size is not None else {})}
    with session_scope(engine) as session:
        _update_run(session, run_id, **values)


def set_measurements(engine: Engine, run_id: int, values: Mapping[str, Any]) -> None:
    """Merge ``values`` into the run's once-per-run measurements (``Run.measurements``): a key
    given again replaces the old value, other keys stay."""
    with session_scope(engine) as session:
        current = session.scalar(select(Run.measurements).where(Run.id == run_id))
        if current is None:
            raise LookupError(f"no run with id {run_id}")
        # A script's summary is also kept on its own column, which the Runs page filters and shows.
        summary = {"summary": dict(values["summary"])} if "summary" in values else {}
        _update_run(session, run_id, measurements={**current, **values}, **summary)
        if summary and session.scalar(select(Run.kind).where(Run.id == run_id)) == script_metrics.SCRIPT_KIND:
            script_metrics.keep_script_figures(session.connection(), run_id)  # a best accuracy it set, say


def log_epoch(engine: Engine, run_id: int, metrics: Mapping[str, Any]) -> None:
    """Store the summary of one epoch; logging the same epoch again replaces it.

    ``metrics`` holds ``epoch`` (1-based), any of the float fields in ``EPOCH_FLOAT_FIELDS``
    (missing ones are stored as NULL) and ``peak_memory_mb`` ({device label: MB}).
    """
    row = {"run_id": run_id, **_epoch_values(metrics), "created_at": utcnow()}
    with session_scope(engine) as session:
        if session.scalar(select(Run.id).where(Run.id == run_id)) is None:
            raise LookupError(f"no run with id {run_id}")
        _upsert_epoch(session, row)
        _keep_figures(session, run_id)


def refresh_figures(engine: Engine, run_id: int) -> None:
    """Work the run's figures out again from its epochs (``log_epoch`` keeps them as it writes each one): for
    epochs written some other way, such as a benchmark's bulk insert."""
    with session_scope(engine) as session:
        _keep_figures(session, run_id)


def get_run(engine: Engine, run_id: int) -> RunRecord | None:
    """The run with this id, or None."""
    with session_scope(engine) as session:
        run = session.get(Run, run_id)
        if run is None:
            return None
        return RunRecord(**{field.name: getattr(run, field.name) for field in fields(RunRecord)})


def list_runs(engine: Engine, *, limit: int | None = None) -> list[RunSummary]:
    """Runs, newest first."""
    columns = [getattr(Run, field.name) for field in fields(RunSummary)]
    statement = select(*columns).order_by(Run.created_at.desc(), Run.id.desc()).limit(limit)
    with session_scope(engine) as session:
        return [RunSummary(**row._asdict()) for row in session.execute(statement)]


def run_summaries(engine: Engine, run_ids: Iterable[int]) -> list[RunSummary]:
    """The runs among ``run_ids`` that exist, newest first: a picker lists the newest runs and these (the ones
    asked for by the address or another page), never every run of a long history."""
    run_ids = [int(run_id) for run_id in dict.fromkeys(run_ids)]
    if not run_ids:
        return []
    columns = [getattr(Run, field.name) for field in fields(RunSummary)]
    statement = select(*columns).where(Run.id.in_(run_ids)).order_by(Run.created_at.desc(), Run.id.desc())
    with session_scope(engine) as session:
        return [RunSummary(**row._asdict()) for row in session.execute(statement)]


def read_epoch_metrics(engine: Engine, run_ids: Iterable[int]) -> list[dict[str, Any]]:
    """One dict per epoch (``run_id`` plus ``EPOCH_FIELDS``) of the given runs, by run then epoch."""
    run_ids = list(run_ids)
    if not run_ids:
        return []
    with session_scope(engine) as session:
        return [row._asdict() for row in session.execute(_select_epochs(run_ids))]


def last_epochs(engine: Engine, run_ids: Iterable[int]) -> dict[int, int]:
    """The last epoch recorded for each of the runs (0 for none): one indexed lookup per run,
    whatever the runs' lengths, so that live pages can ask it on every tick."""
    run_ids = list(run_ids)
    found: dict[int, int] = {}
    if run_ids:
        # A correlated max() per run: SQLite answers each with one seek in the (run_id, epoch)
        # index, where GROUP BY would walk every epoch of the run.
        last = select(func.max(EpochMetric.epoch)).where(EpochMetric.run_id == Run.id).scalar_subquery()
        statement = select(Run.id, last).where(Run.id.in_(run_ids))
        with session_scope(engine) as session:
            found = {run_id: epoch for run_id, epoch in session.execute(statement)}
    return {run_id: int(found.get(run_id) or 0) for run_id in run_ids}


def export_run(engine: Engine, run_id: int) -> dict[str, Any]:
    """Everything about one run as a JSON-serialisable dict (for download and for tests)."""
    with session_scope(engine) as session:
        run = session.get(Run, run_id)
        if run is None:
            raise LookupError(f"no run with id {run_id}")
        run_kind = run.kind
        epochs = [row._asdict() for row in session.execute(_select_epochs([run_id]))]
        for epoch in epochs:
            del epoch["run_id"]
            # Lifted out of extra: the figure users look for, null where no counter was readable.
            epoch["energy_j_per_image"] = (epoch["extra"] or {}).get("energy_j_per_image")
        exported = {
            "run_id": run.id,
            "status": run.status,
            "error": run.error,
            "pid": run.pid,
            "config": run.config,
            "notes": run.notes,
            "epochs": epochs,
            "measurements": run.measurements,
            "created_at": _isoformat(run.created_at),
            "started_at": _isoformat(run.started_at),
            "finished_at": _isoformat(run.finished_at),
            "heartbeat_at": _isoformat(run.heartbeat_at),
            "progress": {
                "epoch": run.progress_epoch,
                "step": run.progress_step,
                "total_steps": run.progress_total_steps,
            },
            "host": run.host,
            "sweep_id": run.sweep_id,
            "world_size": run.world_size,
            "nodes": run.nodes,
            "hosts": run.hosts,
            "elastic_run_id": run.elastic_run_id,
            "tags": run.tags,
            "user_note": run.user_note,
            "strategy": run.strategy,
            "model": run.model,
            "dataset": run.dataset,
            "kind": run.kind,
        }
    # The run's summary as every page shows it (db.run_figures), beside the epochs it sums up.
    exported["figures"] = run_figures(epochs).to_dict()
    if run_kind == "script":  # what it summarised and logged, in the same fields
        from db.script_metrics import run_figures_of

        exported["figures"] = run_figures_of(engine, [run_id])[run_id][0].to_dict()
    # Every point, not downsampled: an export is the record, charts are where points are thinned.
    exported["steps"] = [{name: row[name] for name in series.STEP_FIELDS}
                         for row in series.read_steps(engine, [run_id], max_points=None)]
    if run_kind == "script":  # every value the script logged
        exported["script_metrics"] = script_metrics.read_points(engine, [run_id], max_points=None)
    exported["system"] = [series.export_sample(row, series.sample_host(row["node"], exported["hosts"], exported["host"]))
                          for row in system_metrics.read_samples(engine, [run_id])]
    return exported


def delete_run(engine: Engine, run_id: int) -> None:
    """Delete a run and, through ON DELETE CASCADE, its metrics. Its files are left alone."""
    with session_scope(engine) as session:
        result = session.execute(delete(Run).where(Run.id == run_id))
        if result.rowcount == 0:
            raise LookupError(f"no run with id {run_id}")


RUNS_PER_DELETE = 500  # the most runs one statement deletes (and their metrics, by cascade)


def delete_runs(engine: Engine, run_ids: Iterable[int]) -> int:
    """Delete the runs (their metrics by ON DELETE CASCADE) in one statement; returns how many there were."""
    run_ids = list(run_ids)
    if not run_ids:
        return 0
    with session_scope(engine) as session:
        return session.execute(delete(Run).where(Run.id.in_(run_ids))).rowcount


# --- helpers ------------------------------------------------------------------------------


def _check_status(status: str) -> None:
    if status not in RUN_STATUSES:
        raise ValueError(f"unknown run status {status!r}; allowed: {', '.join(RUN_STATUSES)}")


def _update_run(session: Session, run_id: int, **values: Any) -> None:
    result = session.execute(update(Run).where(Run.id == run_id).values(**values))
    if result.rowcount == 0:
        raise LookupError(f"no run with id {run_id}")


def _unique(notes: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(str(note) for note in notes))


def _isoformat(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _select_epochs(run_ids: list[int]) -> Select[Any]:
    columns = [EpochMetric.run_id, *(getattr(EpochMetric, name) for name in EPOCH_FIELDS)]
    return (
        select(*columns)
        .where(EpochMetric.run_id.in_(run_ids))
        .order_by(EpochMetric.run_id, EpochMetric.epoch)
    )


def _epoch_values(metrics: Mapping[str, Any]) -> dict[str, Any]:
    # Unknown keys are refused rather than dropped: a misspelt "val_accuracy" would
    # otherwise vanish and the chart would silently show no validation curve.
    unknown = sorted(set(metrics) - set(EPOCH_FIELDS))
    if unknown:
        raise ValueError(f"unknown epoch metrics {unknown}; allowed: {', '.join(EPOCH_FIELDS)}")
    try:
        epoch = operator.index(metrics["epoch"])
    except (KeyError, TypeError):
        got = metrics.get("epoch")
        raise ValueError(f"metrics need an integer 'epoch' (1-based), got {got!r}") from None
    if epoch < 1:
        raise ValueError(f"epoch counts from 1, got {epoch}")
    values: dict[str, Any] = {"epoch": epoch}
    for name in EPOCH_FLOAT_FIELDS:
        value = metrics.get(name)
        values[name] = None if value is None else float(value)
    peak_memory_mb = metrics.get("peak_memory_mb") or {}
    values["peak_memory_mb"] = {str(device): float(mb) for device, mb in peak_memory_mb.items()}
    values["extra"] = dict(metrics.get("extra") or {})
    return values


FIGURE_COLUMNS = ("epochs_done", "best_val_acc", "images_per_s", "training_time_s", "epochs_time_s")


def _keep_figures(session: Session, run_id: int) -> None:
    """The run's figures (``run_figures`` of its epochs, a few numbers each) on its row, in the epoch's
    transaction: the Runs page sorts and filters by them without reading an epoch."""
    epochs = session.execute(select(EpochMetric.epoch, EpochMetric.val_acc, EpochMetric.images_per_s,
                                    EpochMetric.train_time_s, EpochMetric.epoch_time_s)
                             .where(EpochMetric.run_id == run_id)).mappings()
    figures = run_figures(epochs).to_dict()
    _update_run(session, run_id, **{name: figures[name] for name in FIGURE_COLUMNS})


def _upsert_epoch(session: Session, row: dict[str, Any]) -> None:
    dialect = session.get_bind().dialect.name
    if dialect in ("sqlite", "postgresql"):
        # One atomic statement: no window between "is it there?" and the insert.
        insert = sqlite_insert if dialect == "sqlite" else postgresql_insert
        statement = insert(EpochMetric).values(**row)
        replaced = {name: statement.excluded[name] for name in row if name not in ("run_id", "epoch")}
        session.execute(
            statement.on_conflict_do_update(index_elements=["run_id", "epoch"], set_=replaced)
        )
        return
    existing = session.scalar(
        select(EpochMetric).where(EpochMetric.run_id == row["run_id"], EpochMetric.epoch == row["epoch"])
    )
    if existing is None:
        session.add(EpochMetric(**row))
    else:
        for name, value in row.items():
            setattr(existing, name, value)

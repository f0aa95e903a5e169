"""The database schema: one row per training run, one row per finished epoch of a run.

These classes are the source of truth for the schema; ``db/migrations/versions`` must
create exactly the same tables (a test compares the two). Changing a model means adding
a migration: ``alembic -c db/alembic.ini revision --autogenerate --rev-id NNNN -m "..."`` (the next number: a
script is named after its revision, which is how ``db.connection.schema_head`` finds the newest).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    LargeBinary,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# "pruned": a trial of a search that the search's pruner ended early, its epochs kept (control/search_driver.py).
RUN_STATUSES: tuple[str, ...] = ("queued", "running", "completed", "failed", "cancelled", "lost", "pruned")
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled", "lost", "pruned"})
SEARCH_STATUSES: tuple[str, ...] = ("running", "finished", "stopped")

# Named constraints let later migrations drop or alter them by name, which SQLite's
# batch mode needs (it cannot address an unnamed constraint).
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """A datetime that is always UTC and always timezone-aware in Python.

    SQLite has no timezone type and hands back naive datetimes; storing UTC and
    re-attaching the zone on the way out gives callers the same value on every backend.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware (UTC) datetime")
        return value.astimezone(timezone.utc)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class DatabaseIdentity(Base):
    """One row: the name this database gives its run folders (``runs/<folder_key>/run-N``), made once
    when the database is created, so two databases under one PARALLAX_HOME (or a database deleted and
    created again there) never share a run's log, checkpoint or deletion."""

    __tablename__ = "database_identity"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    folder_key: Mapped[str] = mapped_column(String(64))
    # Runs up to this id existed before folders were keyed by database and keep runs/run-N.
    unkeyed_runs_up_to: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))


class Sweep(Base):
    """A group of runs of one config, one per strategy, launched together to compare strategies."""

    __tablename__ = "sweeps"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    strategies: Mapped[list[str]] = mapped_column(JSON)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)


class Search(Base):
    """A search over a config's fields: its trials are runs (``Run.search_id``), the study that draws them is
    Optuna's, in the same database under ``study_name`` (db/search_study.py). ``driver_pid``/``driver_host``: the
    process that launches and judges its trials now, None while none does."""

    __tablename__ = "searches"
    __table_args__ = (
        CheckConstraint("status IN (" + ", ".join(f"'{status}'" for status in SEARCH_STATUSES) + ")", name="status"),
        UniqueConstraint("study_name"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    kind: Mapped[str] = mapped_column(String(16))  # "hyper" (the best hyperparameters) or "speed" (the fastest settings)
    study_name: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16))
    # The base RunConfig every trial starts from, and the search's own settings (contract/search_space.py).
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    space: Mapped[dict[str, Any]] = mapped_column(JSON)
    # What was decided before any trial started (configurations skipped, and why), and what happened since.
    notes: Mapped[list[str]] = mapped_column(JSON, default=list, server_default=text("'[]'"))
    driver_pid: Mapped[int | None] = mapped_column(Integer)
    driver_host: Mapped[str | None] = mapped_column(String(255))
    driver_start: Mapped[str | None] = mapped_column(String(64))  # run_state.process_start of the driver


class Run(Base):
    """One training run: its configuration, lifecycle and the process that executes it."""

    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(
            "status IN (" + ", ".join(f"'{status}'" for status in RUN_STATUSES) + ")",
            name="status",
        ),
        # Without AUTOINCREMENT SQLite reuses the id of a deleted last row, and a new run
        # would land in the folder (runs/<database>/run-<id>) of the deleted one.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    status: Mapped[str] = mapped_column(String(16), index=True)

    # Copied out of ``config`` so the run list can filter and sort without parsing JSON.
    strategy: Mapped[str] = mapped_column(String(64), index=True)
    model: Mapped[str] = mapped_column(String(128), index=True)
    # Any path the OS allows (config.MAX_PATH_LENGTH); no index: PostgreSQL indexes at most ~2.7 kB a row.
    dataset: Mapped[str] = mapped_column(Text)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)

    error: Mapped[str | None] = mapped_column(Text)
    pid: Mapped[int | None] = mapped_column(Integer)
    host: Mapped[str | None] = mapped_column(String(255))
    world_size: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    # A run started by torchrun spans machines: how many, each one's host name (by node rank),
    # and torchrun's job id (--rdzv-id), by which a restarted job finds its run again.
    nodes: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    hosts: Mapped[list[str]] = mapped_column(JSON, default=list, server_default=text("'[]'"))
    elastic_run_id: Mapped[str | None] = mapped_column(String(255), index=True)

    notes: Mapped[list[str]] = mapped_column(JSON, default=list, server_default=text("'[]'"))
    # What was measured once per run rather than per epoch, e.g. {"flops_per_image": 1.1e9,
    # "compile_time_s": 41.2, "confusion": {...}}.
    measurements: Mapped[dict[str, Any]] = mapped_column(
        JSON, default=dict, server_default=text("'{}'")
    )
    tags: Mapped[list[str]] = mapped_column(JSON, default=list, server_default=text("'[]'"))
    user_note: Mapped[str] = mapped_column(Text, default="", server_default=text("''"))

    progress_epoch: Mapped[int | None] = mapped_column(Integer)
    progress_step: Mapped[int | None] = mapped_column(Integer)
    progress_total_steps: Mapped[int | None] = mapped_column(Integer)
    # Runs launched together to compare strategies on one config.
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"), index=True)
    # Who trains it: "launched" (launched through Parallax) or "script" (a user's own script logging through
    # ``import parallax``; its metrics are in script_metrics, its config is the script's own).
    kind: Mapped[str] = mapped_column(String(16), default="launched", server_default=text("'launched'"), index=True)
    # A trial of a search: the search, and the trial's number in its study.
    search_id: Mapped[int | None] = mapped_column(ForeignKey("searches.id", ondelete="SET NULL"), index=True)
    search_trial: Mapped[int | None] = mapped_column(Integer)

    # The run's figures (db.run_figures), kept as its epochs are written (store.log_epoch), so that the Runs
    # page sorts, filters and pages 100,000 runs in the database without reading an epoch.
    epochs_done: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    best_val_acc: Mapped[float | None] = mapped_column(Float, index=True)
    images_per_s: Mapped[float | None] = mapped_column(Float, index=True)
    training_time_s: Mapped[float | None] = mapped_column(Float, index=True)
    epochs_time_s: Mapped[float | None] = mapped_column(Float)
    # What a script set as its run's summary (run.summary: any key, numbers and text), beside the figures;
    # small, apart from measurements, so that a filter on a summary key reads no blob.
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, server_default=text("'{}'"))

    epochs: Mapped[list[EpochMetric]] = relationship(
        back_populates="run",
        order_by="EpochMetric.epoch",
        cascade="all, delete-orphan",
        # The database deletes the metric rows (ON DELETE CASCADE); no need to load them first.
        passive_deletes=True,
    )

    def __repr__(self) -> str:
        return f"Run(id={self.id!r}, status={self.status!r}, model={self.model!r})"


class EpochMetric(Base):
    """The summary of one epoch of one run; ``epoch`` counts from 1."""

    __tablename__ = "epoch_metrics"
    __table_args__ = (UniqueConstraint("run_id", "epoch"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)

    train_loss: Mapped[float | None] = mapped_column(Float)
    train_acc: Mapped[float | None] = mapped_column(Float)
    val_loss: Mapped[float | None] = mapped_column(Float)
    val_acc: Mapped[float | None] = mapped_column(Float)
    epoch_time_s: Mapped[float | None] = mapped_column(Float)
    train_time_s: Mapped[float | None] = mapped_column(Float)
    images_per_s: Mapped[float | None] = mapped_column(Float)
    lr: Mapped[float | None] = mapped_column(Float)
    # {device label: peak allocated MB}, e.g. {"cuda:0": 1834.5, "cuda:1": 1790.2}.
    peak_memory_mb: Mapped[dict[str, float]] = mapped_column(
        JSON, default=dict, server_default=text("'{}'")
    )
    # Strategy-specific numbers, e.g. {"stage_busy_fraction": {"stage0": 0.61, ...}} for pipelines.
    extra: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, server_default=text("'{}'"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    run: Mapped[Run] = relationship(back_populates="epochs")

    def __repr__(self) -> str:
        return f"EpochMetric(run_id={self.run_id!r}, epoch={self.epoch!r})"


class ProfileOp(Base):
    """One row of a rank's torch.profiler op table (``key_averages``) for a profiled run."""

    __tablename__ = "profile_ops"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(Text)
    calls: Mapped[int] = mapped_column(Integer)
    self_cpu_us: Mapped[float] = mapped_column(Float)
    cpu_total_us: Mapped[float] = mapped_column(Float)
    self_device_us: Mapped[float] = mapped_column(Float)
    device_total_us: Mapped[float] = mapped_column(Float)
    self_cpu_memory_bytes: Mapped[int] = mapped_column(BigInteger)
    self_device_memory_bytes: Mapped[int] = mapped_column(BigInteger)


class ProfileStep(Base):
    """Where one profiled training step of one rank spent its time, in milliseconds."""

    __tablename__ = "profile_steps"
    __table_args__ = (UniqueConstraint("run_id", "rank", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    data_loading_ms: Mapped[float] = mapped_column(Float)
    forward_ms: Mapped[float] = mapped_column(Float)
    backward_ms: Mapped[float] = mapped_column(Float)
    optimizer_step_ms: Mapped[float] = mapped_column(Float)
    communication_ms: Mapped[float] = mapped_column(Float)
    other_ms: Mapped[float] = mapped_column(Float)
    total_ms: Mapped[float] = mapped_column(Float)


class ProfileTrace(Base):
    """A rank's Chrome trace, gzip-compressed. Its own table, so listing runs or reading the op
    table never loads megabytes of trace."""

    __tablename__ = "profile_traces"
    __table_args__ = (UniqueConstraint("run_id", "rank"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    trace_gz: Mapped[bytes] = mapped_column(LargeBinary)
    trace_bytes: Mapped[int] = mapped_column(BigInteger)  # uncompressed size, for the size warning
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class StepMetric(Base):
    """One training step of one run as rank 0 saw it (at most one point per half second)."""

    __tablename__ = "step_metrics"
    __table_args__ = (UniqueConstraint("run_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)  # counts across epochs, from 1
    t_s: Mapped[float] = mapped_column(Float)  # seconds since the run started training
    train_loss: Mapped[float | None] = mapped_column(Float)
    images_per_s: Mapped[float | None] = mapped_column(Float)
    lr: Mapped[float | None] = mapped_column(Float)


class SystemSeries(Base):
    """One figure of one device that a run's sampler measures (``db.system_metrics``): the host's CPU or
    memory, a rank's CPU or resident memory, a GPU's utilisation, memory, power, temperature or SM clock, on
    one machine of the run. Its values are in ``system_chunks``."""

    __tablename__ = "system_series"
    __table_args__ = (UniqueConstraint("run_id", "node", "kind", "device", "metric"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    # The machine sampled: its node rank in a torchrun job (the run's hosts[node]); 0 for a spawned run.
    node: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))  # "host", "process" (a rank, its DataLoader workers summed in), "gpu"
    device: Mapped[int] = mapped_column(Integer)  # the rank of a process, the index of a GPU; 0 for the host
    metric: Mapped[str] = mapped_column(String(32))  # cpu_pct, memory_mb, rss_mb, util_pct, memory_used_mb, ...
    points: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))  # samples stored, in all
    first_t_s: Mapped[float | None] = mapped_column(Float)  # seconds since the run started training
    last_t_s: Mapped[float | None] = mapped_column(Float)


SYSTEM_SUMMARY_COLUMNS = ("first_t_s", "last_t_s", "points", "finite", "min_value", "max_value", "total_value",
                          "last_value")


class SystemChunk(Base):
    """The values of one system series within one block of ``db.system_metrics.BLOCK_S`` seconds (``t_s //
    BLOCK_S``), packed (float64 seconds and values), with what a chart or a mean needs of them: count, finite
    count, minimum, maximum, sum and last value. A block's chunk grows as the sampler's batches arrive (it is
    rewritten whole, a few hundred bytes), so a day of one-second samples is 1,440 rows per series."""

    __tablename__ = "system_chunks"
    # The summaries in the index too: a chart's or a mean's read of a series never touches the packed values.
    __table_args__ = (Index("ix_system_chunks_series_block", "series_id", "block", *SYSTEM_SUMMARY_COLUMNS),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    series_id: Mapped[int] = mapped_column(ForeignKey("system_series.id", ondelete="CASCADE"))
    block: Mapped[int] = mapped_column(BigInteger)
    first_t_s: Mapped[float] = mapped_column(Float)
    last_t_s: Mapped[float] = mapped_column(Float)
    points: Mapped[int] = mapped_column(Integer)
    finite: Mapped[int] = mapped_column(Integer)
    min_value: Mapped[float | None] = mapped_column(Float)  # over the finite values; NULL where none is
    max_value: Mapped[float | None] = mapped_column(Float)
    total_value: Mapped[float | None] = mapped_column(Float)  # the finite values' sum: a mean without unpacking
    last_value: Mapped[float | None] = mapped_column(Float)  # the value at last_t_s; NULL where not finite
    # Little-endian float64 seconds since the run started and float64 values (NaN: a figure not measured).
    t_s: Mapped[bytes] = mapped_column(LargeBinary)
    values: Mapped[bytes] = mapped_column(LargeBinary)


class ScriptSeries(Base):
    """One name a script logged (``parallax.log``) in one run: its values are in ``script_chunks``."""

    __tablename__ = "script_series"
    __table_args__ = (UniqueConstraint("run_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(255))
    points: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))  # values stored, in all
    last_step: Mapped[int | None] = mapped_column(BigInteger)  # the highest step logged


SUMMARY_COLUMNS = ("first_step", "last_step", "points", "finite", "min_value", "max_value", "last_value", "last_t_s")


class ScriptChunk(Base):
    """Values one series logged within one block of ``db.point_chunks.BLOCK_STEPS`` steps, written together,
    packed (``db.point_chunks``), with what a chart needs of them: count, minimum, maximum and last value.

    A chart reads these summaries, a few hundred rows for a million steps; only a window narrow enough to show
    every point unpacks the values. NaN and infinities are kept in the packed values and counted (``points``
    minus ``finite``); ``min_value`` and ``max_value`` are over the finite ones (NULL where there are none)."""

    __tablename__ = "script_chunks"
    # The summaries in the index too: a chart's read of a series never touches the rows, whose packed values
    # (kilobytes each) would make it read a page per chunk.
    __table_args__ = (Index("ix_script_chunks_series_block", "series_id", "block", *SUMMARY_COLUMNS),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    series_id: Mapped[int] = mapped_column(ForeignKey("script_series.id", ondelete="CASCADE"))
    block: Mapped[int] = mapped_column(BigInteger)  # every step // BLOCK_STEPS
    first_step: Mapped[int] = mapped_column(BigInteger)
    last_step: Mapped[int] = mapped_column(BigInteger)
    points: Mapped[int] = mapped_column(Integer)
    finite: Mapped[int] = mapped_column(Integer)
    min_value: Mapped[float | None] = mapped_column(Float)
    max_value: Mapped[float | None] = mapped_column(Float)
    total_value: Mapped[float | None] = mapped_column(Float)  # the finite values' sum: a mean without unpacking
    last_value: Mapped[float | None] = mapped_column(Float)  # the value at last_step; NULL where not finite
    last_t_s: Mapped[float] = mapped_column(Float)
    # Little-endian int64 steps (NULL where they are first_step, first_step + 1, ... last_step), float64 seconds
    # since the run started, float64 values.
    steps: Mapped[bytes | None] = mapped_column(LargeBinary)
    t_s: Mapped[bytes] = mapped_column(LargeBinary)
    values: Mapped[bytes] = mapped_column(LargeBinary)

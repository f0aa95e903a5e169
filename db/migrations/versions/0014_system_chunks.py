"""System samples stored per metric: ``system_series`` (one row per figure a run's sampler measures: the
host's CPU or memory, a rank's CPU or resident memory, a GPU's utilisation, memory, power, temperature or SM
clock, on one machine) and ``system_chunks`` (one series' values within one block of 60 seconds, packed, with
their count, minimum, maximum, sum and last value), instead of a row per sample in ``system_samples`` whose
ranks and GPUs sit in JSON. A chart of one metric then reads that metric's summaries, never every sample's JSON.

Every figure of every ``system_samples`` row is moved: a host figure where the sample had one, each rank's and
GPU's figures (one not measured as NaN). The packing is written out here, as it stands in this revision, so
that later changes to ``db/system_metrics.py`` never change what this migration writes.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import math

import numpy as np
import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

BLOCK_S = 60
ROWS_PER_READ = 20_000
SUMMARY_COLUMNS = ("first_t_s", "last_t_s", "points", "finite", "min_value", "max_value", "total_value",
                   "last_value")
HOST_METRICS = (("cpu_pct", "host_cpu_pct"), ("memory_mb", "host_memory_mb"))
PROCESS_METRICS = ("cpu_pct", "rss_mb")
GPU_METRICS = ("util_pct", "memory_used_mb", "power_w", "temperature_c", "sm_clock_mhz")


def _old_table() -> sa.TableClause:
    return sa.table("system_samples", sa.column("id", sa.Integer), sa.column("run_id", sa.Integer),
                    sa.column("t_s", sa.Float), sa.column("node", sa.Integer), sa.column("host_cpu_pct", sa.Float),
                    sa.column("host_memory_mb", sa.Float), sa.column("processes", sa.JSON),
                    sa.column("gpus", sa.JSON))


def upgrade() -> None:
    series = op.create_table(
        "system_series",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("node", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("device", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(length=32), nullable=False),
        sa.Column("points", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("first_t_s", sa.Float(), nullable=True),
        sa.Column("last_t_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_system_series_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_system_series"),
        sa.UniqueConstraint("run_id", "node", "kind", "device", "metric",
                            name="uq_system_series_run_id_node_kind_device_metric"),
    )
    chunks = op.create_table(
        "system_chunks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("block", sa.BigInteger(), nullable=False),
        sa.Column("first_t_s", sa.Float(), nullable=False),
        sa.Column("last_t_s", sa.Float(), nullable=False),
        sa.Column("points", sa.Integer(), nullable=False),
        sa.Column("finite", sa.Integer(), nullable=False),
        sa.Column("min_value", sa.Float(), nullable=True),
        sa.Column("max_value", sa.Float(), nullable=True),
        sa.Column("total_value", sa.Float(), nullable=True),
        sa.Column("last_value", sa.Float(), nullable=True),
        sa.Column("t_s", sa.LargeBinary(), nullable=False),
        sa.Column("values", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["series_id"], ["system_series.id"], name="fk_system_chunks_series_id_system_series",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_system_chunks"),
    )
    op.create_index("ix_system_chunks_series_block", "system_chunks", ["series_id", "block", *SUMMARY_COLUMNS],
                    unique=False)
    _move_samples(op.get_bind(), series, chunks)
    op.drop_index("ix_system_samples_run_id", table_name="system_samples")
    op.drop_table("system_samples")


def _move_samples(connection: sa.Connection, series: sa.Table, chunks: sa.Table) -> None:
    old = _old_table()
    run_ids = connection.execute(sa.select(old.c.run_id).distinct().order_by(old.c.run_id)).scalars().all()
    for run_id in run_ids:
        columns: dict[tuple[int, str, int, str], tuple[list[np.ndarray], list[np.ndarray]]] = {}
        after_id = 0
        while True:  # in parts, by id: a long run's samples are never held as rows all at once
            part = connection.execute(
                sa.select(old.c.id, old.c.t_s, old.c.node, old.c.host_cpu_pct, old.c.host_memory_mb,
                          old.c.processes, old.c.gpus)
                .where(old.c.run_id == run_id, old.c.id > after_id).order_by(old.c.id).limit(ROWS_PER_READ)).all()
            if not part:
                break
            after_id = part[-1][0]
            for key, (t_s, values) in _split(part).items():
                held = columns.setdefault(key, ([], []))
                held[0].append(np.asarray(t_s, dtype="<f8"))
                held[1].append(np.asarray(values, dtype="<f8"))
        for (node, kind, device, metric), (t_parts, value_parts) in sorted(columns.items()):
            t_array, value_array = np.concatenate(t_parts), np.concatenate(value_parts)
            series_id = connection.execute(
                sa.insert(series).values(run_id=run_id, node=node, kind=kind, device=device, metric=metric,
                                         points=len(t_array), first_t_s=float(t_array.min()),
                                         last_t_s=float(t_array.max()))
                .returning(series.c.id)).scalar_one()
            connection.execute(sa.insert(chunks), [{**row, "series_id": series_id}
                                                    for row in _pack(t_array, value_array)])


def _split(rows: list) -> dict[tuple[int, str, int, str], tuple[list[float], list[float]]]:
    """Samples as each series' (seconds, values): a host figure where the sample has one, a rank's or GPU's
    figure not measured as NaN."""
    columns: dict[tuple[int, str, int, str], tuple[list[float], list[float]]] = {}

    def add(key: tuple[int, str, int, str], t_s: float, value: object) -> None:
        held = columns.setdefault(key, ([], []))
        held[0].append(t_s)
        held[1].append(math.nan if value is None else float(value))

    for _, t_s, node, host_cpu_pct, host_memory_mb, processes, gpus in rows:
        node = int(node or 0)
        host = {"host_cpu_pct": host_cpu_pct, "host_memory_mb": host_memory_mb}
        for metric, field in HOST_METRICS:
            if host[field] is not None:
                add((node, "host", 0, metric), t_s, host[field])
        for process in processes or []:
            for metric in PROCESS_METRICS:
                add((node, "process", int(process["rank"]), metric), t_s, process.get(metric))
        for gpu in gpus or []:
            for metric in GPU_METRICS:
                add((node, "gpu", int(gpu["index"]), metric), t_s, gpu.get(metric))
    return columns


def _pack(t_s: np.ndarray, values: np.ndarray) -> list[dict]:
    """A series' values as chunks of one block each, in time order (equal times in the order stored)."""
    order = np.argsort(t_s, kind="stable")
    t_s, values = t_s[order], values[order]
    blocks = np.floor(t_s / BLOCK_S).astype(np.int64)
    starts = np.concatenate(([0], np.flatnonzero(blocks[1:] != blocks[:-1]) + 1)).tolist()
    ends = starts[1:] + [len(t_s)]
    rows = []
    for start, end in zip(starts, ends):
        chunk_t, chunk_values = t_s[start:end], values[start:end]
        finite = chunk_values[np.isfinite(chunk_values)]
        last = float(chunk_values[-1])
        rows.append({"block": int(blocks[start]), "first_t_s": float(chunk_t[0]), "last_t_s": float(chunk_t[-1]),
                     "points": end - start, "finite": len(finite),
                     "min_value": float(finite.min()) if len(finite) else None,
                     "max_value": float(finite.max()) if len(finite) else None,
                     "total_value": float(finite.sum()) if len(finite) else None,
                     "last_value": last if math.isfinite(last) else None,
                     "t_s": np.ascontiguousarray(chunk_t).tobytes(),
                     "values": np.ascontiguousarray(chunk_values).tobytes()})
    return rows


def downgrade() -> None:
    op.create_table(
        "system_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("t_s", sa.Float(), nullable=False),
        sa.Column("host_cpu_pct", sa.Float(), nullable=True),
        sa.Column("host_memory_mb", sa.Float(), nullable=True),
        sa.Column("processes", sa.JSON(), server_default=sa.text("'[]'"), nullable=False),
        sa.Column("gpus", sa.JSON(), server_default=sa.text("'[]'"), nullable=False),
        sa.Column("node", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_system_samples_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_system_samples"),
    )
    op.create_index("ix_system_samples_run_id", "system_samples", ["run_id"], unique=False)
    connection = op.get_bind()
    old = _old_table()
    series = sa.table("system_series", sa.column("id"), sa.column("run_id"), sa.column("node"), sa.column("kind"),
                      sa.column("device"), sa.column("metric"))
    chunks = sa.table("system_chunks", sa.column("id"), sa.column("series_id"), sa.column("t_s"),
                      sa.column("values"))
    host_fields = dict(HOST_METRICS)
    for run_id in connection.execute(sa.select(series.c.run_id).distinct().order_by(series.c.run_id)).scalars().all():
        samples: dict[tuple[float, int], dict] = {}
        for series_id, node, kind, device, metric in connection.execute(
                sa.select(series.c.id, series.c.node, series.c.kind, series.c.device, series.c.metric)
                .where(series.c.run_id == run_id)).all():
            for t_s, values in connection.execute(sa.select(chunks.c.t_s, chunks.c["values"])
                                                  .where(chunks.c.series_id == series_id).order_by(chunks.c.id)):
                for at, value in zip(np.frombuffer(t_s, dtype="<f8").tolist(),
                                     np.frombuffer(values, dtype="<f8").tolist()):
                    sample = samples.setdefault((at, node), {"run_id": run_id, "t_s": at, "node": node,
                                                             "host_cpu_pct": None, "host_memory_mb": None,
                                                             "processes": {}, "gpus": {}})
                    figure = value if math.isfinite(value) else None
                    if kind == "host":
                        sample[host_fields[metric]] = figure
                    elif kind == "process":
                        sample["processes"].setdefault(device, {"rank": device})[metric] = figure
                    else:
                        sample["gpus"].setdefault(device, {"index": device})[metric] = figure
        rows = [{**sample, "processes": [entry for _, entry in sorted(sample["processes"].items())],
                 "gpus": [entry for _, entry in sorted(sample["gpus"].items())]}
                for _, sample in sorted(samples.items())]
        if rows:
            connection.execute(sa.insert(old), rows)
    op.drop_index("ix_system_chunks_series_block", table_name="system_chunks")
    op.drop_table("system_chunks")
    op.drop_table("system_series")

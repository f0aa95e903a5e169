"""A script's logged values packed by block of steps: ``script_series`` (one row per name a run logged) and
``script_chunks`` (the values of one series within one block of 128 steps written together, packed, with
their count, minimum, maximum and last value), instead of a row per value in ``script_metrics``. A chart of
a million steps then reads a few thousand summaries, and a value takes 16 to 24 bytes rather than a row.

Every value of ``script_metrics`` is moved, in step order (NaN kept as it was stored: NULL, read as NaN).
The packing is written out here, as it stands in this revision, so that later changes to
``db/point_chunks.py`` never change what this migration writes.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import numpy as np
import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

BLOCK_STEPS = 128
ROWS_PER_READ = 200_000
# In the index with the series and block: a chart's read never touches the rows and their packed values.
SUMMARY_COLUMNS = ("first_step", "last_step", "points", "finite", "min_value", "max_value", "last_value", "last_t_s")


def upgrade() -> None:
    series = op.create_table(
        "script_series",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("points", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_script_series_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_script_series"),
        sa.UniqueConstraint("run_id", "name", name="uq_script_series_run_id_name"),
    )
    chunks = op.create_table(
        "script_chunks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("block", sa.BigInteger(), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("points", sa.Integer(), nullable=False),
        sa.Column("finite", sa.Integer(), nullable=False),
        sa.Column("min_value", sa.Float(), nullable=True),
        sa.Column("max_value", sa.Float(), nullable=True),
        sa.Column("total_value", sa.Float(), nullable=True),
        sa.Column("last_value", sa.Float(), nullable=True),
        sa.Column("last_t_s", sa.Float(), nullable=False),
        sa.Column("steps", sa.LargeBinary(), nullable=True),
        sa.Column("t_s", sa.LargeBinary(), nullable=False),
        sa.Column("values", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["series_id"], ["script_series.id"], name="fk_script_chunks_series_id_script_series",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_script_chunks"),
    )
    op.create_index("ix_script_chunks_series_block", "script_chunks", ["series_id", "block", *SUMMARY_COLUMNS],
                    unique=False)
    _move_values(op.get_bind(), series, chunks)
    op.drop_index("ix_script_metrics_run_name_step", table_name="script_metrics")
    op.drop_table("script_metrics")


def _move_values(connection: sa.Connection, series: sa.Table, chunks: sa.Table) -> None:
    old = sa.table("script_metrics", sa.column("id"), sa.column("run_id"), sa.column("name"), sa.column("step"),
                   sa.column("t_s"), sa.column("value"))
    names = connection.execute(sa.select(old.c.run_id, old.c.name, sa.func.count(), sa.func.max(old.c.step))
                               .group_by(old.c.run_id, old.c.name).order_by(old.c.run_id, old.c.name)).all()
    for run_id, name, count, last_step in names:
        series_id = connection.execute(sa.insert(series).values(run_id=run_id, name=name, points=count,
                                                                  last_step=last_step)
                                       .returning(series.c.id)).scalar_one()
        after_id = 0
        while True:  # in parts, by id: a run of millions of values never held whole
            part = connection.execute(
                sa.select(old.c.id, old.c.step, old.c.t_s, old.c.value)
                .where(old.c.run_id == run_id, old.c.name == name, old.c.id > after_id)
                .order_by(old.c.id).limit(ROWS_PER_READ)).all()
            if not part:
                break
            after_id = part[-1][0]
            rows = _pack([row[1] for row in part], [row[2] for row in part], [row[3] for row in part])
            connection.execute(sa.insert(chunks), [{**row, "series_id": series_id} for row in rows])


def _pack(steps: list, t_s: list, values: list) -> list[dict]:
    step_array = np.asarray(steps, dtype="<i8")
    order = np.argsort(step_array, kind="stable")
    step_array = step_array[order]
    t_array = np.asarray(t_s, dtype="<f8")[order]
    value_array = np.asarray(values, dtype="<f8")[order]  # NULL (a NaN stored before) reads as NaN
    blocks = step_array // BLOCK_STEPS
    starts = np.concatenate(([0], np.flatnonzero(blocks[1:] != blocks[:-1]) + 1)).tolist()
    ends = starts[1:] + [len(step_array)]
    rows = []
    for start, end in zip(starts, ends):
        chunk_steps, chunk_values = step_array[start:end], value_array[start:end]
        finite = chunk_values[np.isfinite(chunk_values)]
        first, last = int(chunk_steps[0]), int(chunk_steps[-1])
        consecutive = last - first + 1 == end - start and bool(np.all(np.diff(chunk_steps) == 1))
        last_value = float(chunk_values[-1])
        rows.append({"block": int(blocks[start]), "first_step": first, "last_step": last, "points": end - start,
                     "finite": len(finite), "min_value": float(finite.min()) if len(finite) else None,
                     "max_value": float(finite.max()) if len(finite) else None,
                     "total_value": float(finite.sum()) if len(finite) else None,
                     "last_value": last_value if np.isfinite(last_value) else None,
                     "last_t_s": float(t_array[end - 1]), "steps": None if consecutive else chunk_steps.tobytes(),
                     "t_s": t_array[start:end].tobytes(), "values": chunk_values.tobytes()})
    return rows


def downgrade() -> None:
    old = op.create_table(
        "script_metrics",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("t_s", sa.Float(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_script_metrics_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_script_metrics"),
    )
    op.create_index("ix_script_metrics_run_name_step", "script_metrics", ["run_id", "name", "step"], unique=False)
    connection = op.get_bind()
    series = sa.table("script_series", sa.column("id"), sa.column("run_id"), sa.column("name"))
    chunks = sa.table("script_chunks", sa.column("id"), sa.column("series_id"), sa.column("first_step"),
                      sa.column("steps"), sa.column("t_s"), sa.column("values"))
    for series_id, run_id, name in connection.execute(sa.select(series.c.id, series.c.run_id, series.c.name)).all():
        for first, steps, t_s, values in connection.execute(
                sa.select(chunks.c.first_step, chunks.c.steps, chunks.c.t_s, chunks.c["values"])
                .where(chunks.c.series_id == series_id).order_by(chunks.c.id)).all():
            value_array = np.frombuffer(values, dtype="<f8")
            step_array = (np.arange(first, first + len(value_array)) if steps is None
                          else np.frombuffer(steps, dtype="<i8"))
            connection.execute(sa.insert(old), [
                {"run_id": run_id, "name": name, "step": int(step), "t_s": float(at),
                 "value": float(value) if np.isfinite(value) else None}
                for step, at, value in zip(step_array, np.frombuffer(t_s, dtype="<f8"), value_array)])
    op.drop_index("ix_script_chunks_series_block", table_name="script_chunks")
    op.drop_table("script_chunks")
    op.drop_table("script_series")

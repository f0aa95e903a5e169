"""Add the profiler tables: op table, per-step breakdown and gzipped Chrome traces per rank.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    op.create_table(
        "profile_ops",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("self_cpu_us", sa.Float(), nullable=False),
        sa.Column("cpu_total_us", sa.Float(), nullable=False),
        sa.Column("self_device_us", sa.Float(), nullable=False),
        sa.Column("device_total_us", sa.Float(), nullable=False),
        sa.Column("self_cpu_memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("self_device_memory_bytes", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_profile_ops_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_profile_ops")),
    )
    op.create_index(op.f("ix_profile_ops_run_id"), "profile_ops", ["run_id"])
    op.create_table(
        "profile_steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=False) for name in (
            "data_loading_ms", "forward_ms", "backward_ms", "optimizer_step_ms",
            "communication_ms", "other_ms", "total_ms")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_profile_steps_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_profile_steps")),
        sa.UniqueConstraint("run_id", "rank", "step", name=op.f("uq_profile_steps_run_id_rank_step")),
    )
    op.create_index(op.f("ix_profile_steps_run_id"), "profile_steps", ["run_id"])
    op.create_table(
        "profile_traces",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("trace_gz", sa.LargeBinary(), nullable=False),
        sa.Column("trace_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_profile_traces_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_profile_traces")),
        sa.UniqueConstraint("run_id", "rank", name=op.f("uq_profile_traces_run_id_rank")),
    )
    op.create_index(op.f("ix_profile_traces_run_id"), "profile_traces", ["run_id"])


def downgrade() -> None:
    for table in ("profile_traces", "profile_steps", "profile_ops"):
        op.drop_index(op.f(f"ix_{table}_run_id"), table_name=table)
        op.drop_table(table)

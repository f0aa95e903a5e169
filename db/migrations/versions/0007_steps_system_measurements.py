"""Add step_metrics (per-step loss, images/s and lr), system_samples (CPU, memory and GPU readings
every second) and runs.measurements (what is measured once per run: FLOPs per image, compile time,
the best epoch's confusion matrix).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.add_column(
            sa.Column("measurements", sa.JSON(), server_default=sa.text("'{}'"), nullable=False)
        )
    op.create_table(
        "step_metrics",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("t_s", sa.Float(), nullable=False),
        sa.Column("train_loss", sa.Float(), nullable=True),
        sa.Column("images_per_s", sa.Float(), nullable=True),
        sa.Column("lr", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_step_metrics_run_id_runs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_step_metrics")),
        sa.UniqueConstraint("run_id", "step", name=op.f("uq_step_metrics_run_id_step")),
    )
    op.create_index(op.f("ix_step_metrics_run_id"), "step_metrics", ["run_id"], unique=False)
    op.create_table(
        "system_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("t_s", sa.Float(), nullable=False),
        sa.Column("host_cpu_pct", sa.Float(), nullable=True),
        sa.Column("host_memory_mb", sa.Float(), nullable=True),
        sa.Column("processes", sa.JSON(), server_default=sa.text("'[]'"), nullable=False),
        sa.Column("gpus", sa.JSON(), server_default=sa.text("'[]'"), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_system_samples_run_id_runs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_system_samples")),
    )
    op.create_index(op.f("ix_system_samples_run_id"), "system_samples", ["run_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_system_samples_run_id"), table_name="system_samples")
    op.drop_table("system_samples")
    op.drop_index(op.f("ix_step_metrics_run_id"), table_name="step_metrics")
    op.drop_table("step_metrics")
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("measurements")

"""Create the runs and epoch_metrics tables.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Written out by hand, not imported from db.tables: a migration must keep creating the
schema as it was at this revision, whatever the models look like later.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

RUN_STATUSES = ("queued", "running", "completed", "failed", "cancelled", "lost")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("strategy", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("dataset", sa.String(length=128), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("world_size", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("notes", sa.JSON(), server_default=sa.text("'[]'"), nullable=False),
        sa.Column("tags", sa.JSON(), server_default=sa.text("'[]'"), nullable=False),
        sa.Column("user_note", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("progress_epoch", sa.Integer(), nullable=True),
        sa.Column("progress_step", sa.Integer(), nullable=True),
        sa.Column("progress_total_steps", sa.Integer(), nullable=True),
        sa.CheckConstraint(
            "status IN (" + ", ".join(f"'{status}'" for status in RUN_STATUSES) + ")",
            name=op.f("ck_runs_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sqlite_autoincrement=True,
    )
    for column in ("created_at", "status", "strategy", "model", "dataset"):
        op.create_index(op.f(f"ix_runs_{column}"), "runs", [column], unique=False)

    op.create_table(
        "epoch_metrics",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("train_loss", sa.Float(), nullable=True),
        sa.Column("train_acc", sa.Float(), nullable=True),
        sa.Column("val_loss", sa.Float(), nullable=True),
        sa.Column("val_acc", sa.Float(), nullable=True),
        sa.Column("epoch_time_s", sa.Float(), nullable=True),
        sa.Column("train_time_s", sa.Float(), nullable=True),
        sa.Column("images_per_s", sa.Float(), nullable=True),
        sa.Column("lr", sa.Float(), nullable=True),
        sa.Column("peak_memory_mb", sa.JSON(), server_default=sa.text("'{}'"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_epoch_metrics_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_epoch_metrics")),
        sa.UniqueConstraint("run_id", "epoch", name=op.f("uq_epoch_metrics_run_id_epoch")),
    )
    op.create_index(op.f("ix_epoch_metrics_run_id"), "epoch_metrics", ["run_id"], unique=False)


def downgrade() -> None:
    op.drop_table("epoch_metrics")
    op.drop_table("runs")

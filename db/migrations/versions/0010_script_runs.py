"""Runs of users' own scripts (``import parallax``): ``runs.kind`` tells them ("script") from runs the
engine trains ("engine"), and ``script_metrics`` holds what a script logged, any name at any step.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.add_column(sa.Column("kind", sa.String(length=16), server_default=sa.text("'engine'"), nullable=False))
        batch.create_index("ix_runs_kind", ["kind"], unique=False)
    op.create_table(
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


def downgrade() -> None:
    op.drop_index("ix_script_metrics_run_name_step", table_name="script_metrics")
    op.drop_table("script_metrics")
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_index("ix_runs_kind")
        batch.drop_column("kind")

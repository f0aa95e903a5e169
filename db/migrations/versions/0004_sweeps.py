"""Add sweeps (runs of one config launched together, one per strategy) and runs.sweep_id.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("strategies", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
        sqlite_autoincrement=True,
    )
    # SQLite rebuilds the table; keep AUTOINCREMENT so a deleted run's id is never reused.
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.add_column(sa.Column("sweep_id", sa.Integer(), nullable=True))
        batch.create_index(batch.f("ix_runs_sweep_id"), ["sweep_id"])
        batch.create_foreign_key(batch.f("fk_runs_sweep_id_sweeps"), "sweeps", ["sweep_id"], ["id"], ondelete="SET NULL")


def downgrade() -> None:
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_constraint(batch.f("fk_runs_sweep_id_sweeps"), type_="foreignkey")
        batch.drop_index(batch.f("ix_runs_sweep_id"))
        batch.drop_column("sweep_id")
    op.drop_table("sweeps")

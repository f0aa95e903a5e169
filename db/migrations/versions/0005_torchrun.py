"""Add runs.nodes, runs.hosts and runs.elastic_run_id: runs that torchrun starts across machines.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    # SQLite rebuilds the table; keep AUTOINCREMENT so a deleted run's id is never reused.
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.add_column(sa.Column("nodes", sa.Integer(), server_default=sa.text("1"), nullable=False))
        batch.add_column(sa.Column("hosts", sa.JSON(), server_default=sa.text("'[]'"), nullable=False))
        batch.add_column(sa.Column("elastic_run_id", sa.String(length=255), nullable=True))
        batch.create_index(batch.f("ix_runs_elastic_run_id"), ["elastic_run_id"])


def downgrade() -> None:
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_index(batch.f("ix_runs_elastic_run_id"))
        batch.drop_column("elastic_run_id")
        batch.drop_column("hosts")
        batch.drop_column("nodes")

"""Add database_identity: the key that names this database's run folders (runs/<key>/run-N).

Runs that exist when a database is upgraded keep their folders (runs/run-N): the row records
the highest such id, so their logs, checkpoints and deletion still find them.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    op.create_table(
        "database_identity",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("folder_key", sa.String(length=64), nullable=False),
        sa.Column("unkeyed_runs_up_to", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_database_identity")),
    )
    # One statement, so `alembic upgrade head --sql` writes it too; the key is hex digits only.
    op.execute(f"INSERT INTO database_identity (id, folder_key, unkeyed_runs_up_to) "
               f"SELECT 1, '{uuid.uuid4().hex}', COALESCE(MAX(id), 0) FROM runs")


def downgrade() -> None:
    op.drop_table("database_identity")

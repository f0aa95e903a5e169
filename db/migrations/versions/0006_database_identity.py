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
    table = op.create_table(
        "database_identity",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("folder_key", sa.String(length=64), nullable=False),
        sa.Column("unkeyed_runs_up_to", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_database_identity")),
    )
    existing = op.get_bind().execute(sa.text("SELECT MAX(id) FROM runs")).scalar()
    op.bulk_insert(table, [{"id": 1, "folder_key": uuid.uuid4().hex, "unkeyed_runs_up_to": existing or 0}])


def downgrade() -> None:
    op.drop_table("database_identity")

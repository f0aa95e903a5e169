"""Add system_samples.node: the machine a sample is of (its node rank in a torchrun job; 0 for a
spawned run), now that every machine of a torchrun job is sampled.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    with op.batch_alter_table("system_samples") as batch:
        batch.add_column(sa.Column("node", sa.Integer(), server_default=sa.text("0"), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("system_samples") as batch:
        batch.drop_column("node")

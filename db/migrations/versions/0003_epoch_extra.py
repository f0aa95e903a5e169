"""Add epoch_metrics.extra: strategy-specific numbers per epoch (pipeline stage busy time).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    with op.batch_alter_table("epoch_metrics") as batch:
        batch.add_column(sa.Column("extra", sa.JSON(), server_default=sa.text("'{}'"), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("epoch_metrics") as batch:
        batch.drop_column("extra")

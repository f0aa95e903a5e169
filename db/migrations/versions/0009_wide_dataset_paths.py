"""Widen runs.dataset from varchar(128) to text, and drop its index: a dataset folder path may be
as long as the OS allows (4096 characters, which config.py checks), which PostgreSQL refused
("value too long for type character varying(128)") where SQLite never enforced the length. A
btree index entry holds at most about 2.7 kB on PostgreSQL, shorter than such a path, and the
run table is filtered by dataset in memory-sized tables, so the index goes.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_index("ix_runs_dataset")
        batch.alter_column("dataset", existing_type=sa.String(length=128), type_=sa.Text(), existing_nullable=False)


def downgrade() -> None:
    # Paths over 128 characters would not fit back: downgrading keeps their first 128.
    op.execute(sa.text("UPDATE runs SET dataset = substr(dataset, 1, 128) WHERE length(dataset) > 128"))
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.alter_column("dataset", existing_type=sa.Text(), type_=sa.String(length=128), existing_nullable=False)
        batch.create_index("ix_runs_dataset", ["dataset"], unique=False)

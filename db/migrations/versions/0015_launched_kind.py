"""A run Parallax launched is of kind ``launched`` (it was ``engine``, the word SQLAlchemy's engine keeps); a
script's run stays ``script``. The rows already there are rewritten, and the column's default with them.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def _rename_kind(old: str, new: str) -> None:
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.alter_column("kind", existing_type=sa.String(length=16), existing_nullable=False,
                           server_default=sa.text(f"'{new}'"))
    runs = sa.table("runs", sa.column("kind", sa.String(16)))
    op.get_bind().execute(runs.update().where(runs.c.kind == old).values(kind=new))


def upgrade() -> None:
    _rename_kind("engine", "launched")


def downgrade() -> None:
    _rename_kind("launched", "engine")

"""Searches (``parallax search``): a ``searches`` table, ``runs.search_id`` and ``runs.search_trial`` (a run that is
a trial of a search, and its number in the search's study), and the run status ``pruned`` (a trial its search's
pruner ended early, its epochs kept). Optuna's own tables are Optuna's: its storage makes them beside these
(db/search_study.py).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

BEFORE = ("queued", "running", "completed", "failed", "cancelled", "lost")
AFTER = (*BEFORE, "pruned")
SEARCH_STATUSES = ("running", "finished", "stopped")


def _status_check(statuses: tuple[str, ...]) -> str:
    return "status IN (" + ", ".join(f"'{status}'" for status in statuses) + ")"


def upgrade() -> None:
    op.create_table(
        "searches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("study_name", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("space", sa.JSON(), nullable=False),
        sa.Column("notes", sa.JSON(), server_default=sa.text("'[]'"), nullable=False),
        sa.Column("driver_pid", sa.Integer(), nullable=True),
        sa.Column("driver_host", sa.String(length=255), nullable=True),
        sa.Column("driver_start", sa.String(length=64), nullable=True),
        sa.CheckConstraint(_status_check(SEARCH_STATUSES), name=op.f("ck_searches_status")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_searches")),
        sa.UniqueConstraint("study_name", name=op.f("uq_searches_study_name")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_constraint(op.f("ck_runs_status"), type_="check")
        batch.create_check_constraint(op.f("ck_runs_status"), _status_check(AFTER))
        batch.add_column(sa.Column("search_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("search_trial", sa.Integer(), nullable=True))
        batch.create_index("ix_runs_search_id", ["search_id"], unique=False)
        batch.create_foreign_key("fk_runs_search_id_searches", "searches", ["search_id"], ["id"], ondelete="SET NULL")


def downgrade() -> None:
    # A pruned run had ended early by its search's choice: before this revision that is a cancel.
    op.execute(sa.text("UPDATE runs SET status = 'cancelled' WHERE status = 'pruned'"))
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_constraint("fk_runs_search_id_searches", type_="foreignkey")
        batch.drop_index("ix_runs_search_id")
        batch.drop_column("search_trial")
        batch.drop_column("search_id")
        batch.drop_constraint(op.f("ck_runs_status"), type_="check")
        batch.create_check_constraint(op.f("ck_runs_status"), _status_check(BEFORE))
    op.drop_table("searches")

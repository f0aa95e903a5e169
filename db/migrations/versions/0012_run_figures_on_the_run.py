"""Each run's figures on its own row: epochs done, best validation accuracy, images/s (the mean over the
epochs after the first), training time and the epochs' time, kept as its epochs are written, and a
script's summary; the Runs page then sorts and filters 100,000 runs without reading their epochs.

The figures of the runs already there are computed here from their epochs as ``db.run_figures`` computes
them in this revision (written out, so that a later change there never changes what this wrote), and each
script run's summary is copied from its measurements.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

FIGURES = ("best_val_acc", "images_per_s", "training_time_s")
RUNS_PER_UPDATE = 5_000


def upgrade() -> None:
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.add_column(sa.Column("epochs_done", sa.Integer(), server_default=sa.text("0"), nullable=False))
        for name in FIGURES:
            batch.add_column(sa.Column(name, sa.Float(), nullable=True))
        batch.add_column(sa.Column("epochs_time_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("summary", sa.JSON(), server_default=sa.text("'{}'"), nullable=False))
        for name in FIGURES:
            batch.create_index(f"ix_runs_{name}", [name], unique=False)
    connection = op.get_bind()
    runs = sa.table("runs", sa.column("id"), sa.column("epochs_done"), sa.column("best_val_acc"),
                    sa.column("images_per_s"), sa.column("training_time_s"), sa.column("epochs_time_s"),
                    sa.column("summary", sa.JSON()), sa.column("kind"), sa.column("measurements", sa.JSON()))
    epochs = sa.table("epoch_metrics", sa.column("run_id"), sa.column("epoch"), sa.column("val_acc"),
                      sa.column("images_per_s"), sa.column("train_time_s"), sa.column("epoch_time_s"))
    by_run: dict[int, list] = {}
    for row in connection.execute(sa.select(epochs.c.run_id, epochs.c.epoch, epochs.c.val_acc, epochs.c.images_per_s,
                                            epochs.c.train_time_s, epochs.c.epoch_time_s)
                                  .order_by(epochs.c.run_id, epochs.c.epoch)):
        by_run.setdefault(row.run_id, []).append(row)
    figures = [{"run": run_id, **_figures(rows)} for run_id, rows in by_run.items()]
    update = (sa.update(runs).where(runs.c.id == sa.bindparam("run"))
              .values(**{name: sa.bindparam(name) for name in ("epochs_done", *FIGURES, "epochs_time_s")}))
    for start in range(0, len(figures), RUNS_PER_UPDATE):
        connection.execute(update, figures[start:start + RUNS_PER_UPDATE])
    summaries = []
    for run_id, measurements in connection.execute(sa.select(runs.c.id, runs.c.measurements)
                                                   .where(runs.c.kind == "script")):
        if isinstance(measurements, str):
            measurements = json.loads(measurements)
        summary = (measurements or {}).get("summary") or {}
        if summary:
            summaries.append({"run": run_id, "summary": summary})
    if summaries:
        connection.execute(sa.update(runs).where(runs.c.id == sa.bindparam("run"))
                           .values(summary=sa.bindparam("summary", type_=sa.JSON())), summaries)


def _figures(rows: list) -> dict:
    def number(value) -> bool:
        return value is not None and value == value

    measured = [(row.epoch, float(row.images_per_s)) for row in rows if number(row.images_per_s)]
    steady = measured[1:] if len(measured) > 1 else measured
    accuracies = [float(row.val_acc) for row in rows if number(row.val_acc)]

    def total(values: list) -> float | None:
        return float(sum(values)) if values and all(number(v) for v in values) else None

    return {"epochs_done": len(rows), "best_val_acc": max(accuracies) if accuracies else None,
            "images_per_s": sum(v for _, v in steady) / len(steady) if steady else None,
            "training_time_s": total([row.train_time_s for row in rows]),
            "epochs_time_s": total([row.epoch_time_s for row in rows])}


def downgrade() -> None:
    with op.batch_alter_table("runs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        for name in FIGURES:
            batch.drop_index(f"ix_runs_{name}")
        for name in ("summary", "epochs_time_s", *reversed(FIGURES), "epochs_done"):
            batch.drop_column(name)

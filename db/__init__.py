"""Parallax's database: open it with ``make_engine()``, then use the store functions.

    import db
    engine = db.make_engine()
    run_id = db.create_run(engine, config.to_dict())
    db.log_epoch(engine, run_id, {"epoch": 1, "train_loss": 0.9, ...})
"""

from db.connection import dispose_engines, make_engine, session_scope
from db.tables import RUN_STATUSES, TERMINAL_STATUSES
from db.store import (
    RunRecord,
    RunSummary,
    add_notes,
    create_run,
    delete_run,
    export_run,
    get_run,
    list_runs,
    log_epoch,
    read_epoch_metrics,
    set_process,
    set_status,
)

__all__ = [
    "RUN_STATUSES",
    "TERMINAL_STATUSES",
    "RunRecord",
    "RunSummary",
    "add_notes",
    "create_run",
    "delete_run",
    "dispose_engines",
    "export_run",
    "get_run",
    "list_runs",
    "log_epoch",
    "make_engine",
    "read_epoch_metrics",
    "session_scope",
    "set_process",
    "set_status",
]

"""Removing finished runs for good: the database row, its metrics, and its folder (log,
checkpoints, profiler traces).

    delete_run_and_files(7)        # RunActiveError if run 7 is queued or running: cancel it first
    deleted, refused = delete_runs_and_files([3, 4, 5])   # many at once: a few statements, not one per run

Imports neither torch nor streamlit: the dashboard calls it.
"""

from __future__ import annotations

import shutil

from db import run_state as state
from db import make_engine, store
from db.folders import run_folder

from contract.storage import OLDER_RESUME_FILE, RESUME_FILE


class RunActiveError(ValueError):
    """The run is queued or running; deleting it would pull its files from under its processes."""


class OutsideRunFolder(ValueError):
    """A run's file that resolves outside the run's folder (e.g. a link planted there)."""


def run_file(engine, run_id: int, name: str):
    """``run_folder(engine, run_id) / name``, refused if it resolves (through ``..`` or a link) outside that
    folder: what the dashboard reads or offers for download is always the run's own file."""
    folder = run_folder(engine, int(run_id)).resolve()
    path = (folder / name).resolve()
    if path.parent != folder:
        raise OutsideRunFolder(f"{name} of run {run_id} leads outside the run's folder {folder} (to {path}): "
                               "it is not shown or offered for download")
    return folder / name


def checkpoint_files(engine, run_id: int) -> dict[str, int]:
    """The run's checkpoint files (resume points, the best epoch's weights) and their sizes in bytes."""
    folder = run_folder(engine, int(run_id))
    names = [RESUME_FILE, *sorted(p.name for p in folder.glob(OLDER_RESUME_FILE.format(epoch="*"))), "best.pt"]
    sizes = {}
    for name in names:
        try:
            path = run_file(engine, run_id, name)
            if path.is_file():
                sizes[name] = path.stat().st_size
        except (OSError, OutsideRunFolder):
            continue
    return sizes


def delete_run_and_files(run_id: int, *, db_url: str | None = None) -> None:
    """Delete a finished run: its files first, then its row and (by cascade) its metrics.

    Files go first so that a failure part-way leaves the row in place and the delete can be retried.
    """
    engine = make_engine(db_url)
    state.mark_lost_runs(engine)  # a run whose process died is no longer active and may go
    run = store.get_run(engine, run_id)
    if run is None:
        raise LookupError(f"no run with id {run_id}")
    if run.status in state.ACTIVE_STATUSES:
        raise RunActiveError(f"run {run_id} is {run.status}: cancel it first, then delete it")
    folder = run_folder(engine, run_id)
    if folder.exists():
        shutil.rmtree(folder)
    store.delete_run(engine, run_id)


def delete_runs_and_files(run_ids, *, db_url: str | None = None) -> tuple[list[int], list[str]]:
    """Delete many finished runs as ``delete_run_and_files`` deletes one (files first, then rows), in a few
    statements whatever their number: 10,000 runs picked on the Runs page go in seconds. Returns the runs
    deleted and one line for each that was not (active, or not there)."""
    engine = make_engine(db_url)
    state.mark_lost_runs(engine)
    wanted = list(dict.fromkeys(int(run_id) for run_id in run_ids))
    statuses = {run.id: run.status for run in store.run_summaries(engine, wanted)}
    refused = [f"no run with id {run_id}" for run_id in wanted if run_id not in statuses]
    refused += [f"run {run_id} is {statuses[run_id]}: cancel it first, then delete it" for run_id in wanted
                if statuses.get(run_id) in state.ACTIVE_STATUSES]
    deletable = [run_id for run_id in wanted if run_id in statuses and statuses[run_id] not in state.ACTIVE_STATUSES]
    deleted = []
    for start in range(0, len(deletable), store.RUNS_PER_DELETE):
        part = deletable[start:start + store.RUNS_PER_DELETE]
        for run_id in part:
            folder = run_folder(engine, run_id)
            if folder.exists():
                shutil.rmtree(folder)
        store.delete_runs(engine, part)
        deleted += part
    return deleted, refused

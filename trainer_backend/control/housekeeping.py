"""Removing finished runs for good: the database row, its metrics, and its folder (log,
checkpoints, profiler traces).

    delete_run_and_files(7)        # RunActiveError if run 7 is queued or running: cancel it first
    deleted, refused = delete_runs_and_files([3, 4, 5])   # many at once: in batches, each its own transaction

Imports neither torch nor streamlit: the dashboard calls it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError

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


FIRST_BATCH_RUNS = 50  # runs in the first transaction; later ones grow or shrink to keep each short
BATCH_TARGET_S = 0.25  # a batch's transaction holds SQLite's write lock: other writers wait at most about this


def delete_runs_and_files(run_ids, *, db_url: str | None = None,
                          progress: Callable[[int, int], None] | None = None) -> tuple[list[int], list[str]]:
    """Delete many finished runs, in batches: each batch's rows (a run with all its metrics, by cascade) in one
    transaction of its own, then their folders. A batch starts at ``FIRST_BATCH_RUNS`` runs and doubles (up to
    ``store.RUNS_PER_DELETE``) while one takes under half ``BATCH_TARGET_S``, and halves when one takes longer:
    the write lock is held for a fraction of a second at a time, so running runs' writes go on between batches.
    ``progress(done, deletable)`` is called after each batch.

    Returns the runs deleted and one line for each that was not (active, or not there); a batch that fails
    (the database locked past its wait, a full disk) stops the deletion with one line saying how many runs
    were deleted and that the rest are left whole, as they were."""
    engine = make_engine(db_url)
    state.mark_lost_runs(engine)
    wanted = list(dict.fromkeys(int(run_id) for run_id in run_ids))
    statuses = {run.id: run.status for run in store.run_summaries(engine, wanted)}
    refused = [f"no run with id {run_id}" for run_id in wanted if run_id not in statuses]
    refused += [f"run {run_id} is {statuses[run_id]}: cancel it first, then delete it" for run_id in wanted
                if statuses.get(run_id) in state.ACTIVE_STATUSES]
    deletable = [run_id for run_id in wanted if run_id in statuses and statuses[run_id] not in state.ACTIVE_STATUSES]
    deleted: list[int] = []
    kept_folders: list[str] = []
    batch_runs = min(FIRST_BATCH_RUNS, store.RUNS_PER_DELETE)
    while len(deleted) < len(deletable):
        part = deletable[len(deleted):len(deleted) + batch_runs]
        started = time.perf_counter()
        try:
            store.delete_runs(engine, part)
        except SQLAlchemyError as exc:
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            refused.append(f"deleting stopped after {len(deleted):,} of {len(deletable):,} runs: {reason}; the other "
                           f"{len(deletable) - len(deleted):,} runs are left whole, as they were")
            break
        took_s = time.perf_counter() - started
        # The folders after the rows: a failure above leaves each run whole, its row and its files together.
        for run_id in part:
            folder = run_folder(engine, run_id)
            try:
                if folder.exists():
                    shutil.rmtree(folder)
            except OSError as exc:
                kept_folders.append(f"{folder} ({exc.strerror or exc})")
        deleted += part
        if progress is not None:
            progress(len(deleted), len(deletable))
        if took_s > BATCH_TARGET_S:
            batch_runs = max(1, batch_runs // 2)
        elif took_s < BATCH_TARGET_S / 2:
            batch_runs = min(store.RUNS_PER_DELETE, batch_runs * 2)
    if kept_folders:
        refused.append(f"the folders of {len(kept_folders):,} deleted runs could not be removed; remove them by "
                       f"hand: {kept_folders[0]}" + (f" and {len(kept_folders) - 1:,} more" if len(kept_folders) > 1
                                                     else ""))
    return deleted, refused

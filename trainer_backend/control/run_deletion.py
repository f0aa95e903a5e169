"""Deleting many runs behind the dashboard: the Runs page starts a deletion and returns at once; a thread of the
server deletes the runs in batches (``housekeeping.delete_runs_and_files``) while later reruns of any page read
how far it has gone and which runs are on their way out.

    key = start_deletion([3, 4, 5])      # returns at once
    deletion(key)                        # Deletion(total=3, done=1, finished=False, ...), a copy
    runs_being_deleted()                 # {3, 4, 5} until each deletion has finished
    progress_under_way()                 # (1, 3): runs done and to do of every deletion under way; None: none
    forget(key)                          # once its end has been shown

A thread, not a detached process: the work is a few hundred short transactions and folder removals, nothing a
run's supervisor would add; progress lives in the server's memory and is lost with it, and so is the rest of
the deletion, which leaves the runs not reached whole (each batch is one transaction with its runs' metrics).
Imports neither torch nor streamlit.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time

from trainer_backend.control.housekeeping import delete_runs_and_files

DELETION_THREAD_PREFIX = "delete-runs-"
KEPT_AFTER_END_S = 3600.0  # an ended deletion no page has asked to forget (its tab closed) goes after this


@dataclasses.dataclass
class Deletion:
    """One deletion's progress: ``done`` of ``total`` runs (those that may be deleted) so far."""

    run_ids: frozenset[int]
    total: int = 0
    done: int = 0
    finished: bool = False
    ended_at: float | None = None  # time.monotonic() when it ended
    deleted: list[int] = dataclasses.field(default_factory=list)
    refused: list[str] = dataclasses.field(default_factory=list)  # one line each: a run refused, or why it stopped


_lock = threading.Lock()
_deletions: dict[int, Deletion] = {}
_keys = itertools.count(1)


def start_deletion(run_ids, *, db_url: str | None = None) -> int:
    """Start deleting ``run_ids`` in a thread of this process; returns the deletion's key at once."""
    wanted = [int(run_id) for run_id in run_ids]
    with _lock:
        now = time.monotonic()
        for old in [k for k, job in _deletions.items() if job.finished and now - job.ended_at > KEPT_AFTER_END_S]:
            del _deletions[old]
        key = next(_keys)
        _deletions[key] = Deletion(run_ids=frozenset(wanted), total=len(wanted))
    threading.Thread(target=_delete, args=(key, wanted, db_url), name=f"{DELETION_THREAD_PREFIX}{key}",
                     daemon=True).start()
    return key


def deletion(key: int) -> Deletion | None:
    """A copy of deletion ``key`` as it stands (None: no such deletion, or forgotten)."""
    with _lock:
        found = _deletions.get(key)
        return None if found is None else dataclasses.replace(found, deleted=list(found.deleted),
                                                              refused=list(found.refused))


def runs_being_deleted() -> set[int]:
    """The runs of every deletion not yet finished: the table marks them."""
    with _lock:
        return {run_id for job in _deletions.values() if not job.finished for run_id in job.run_ids}


def progress_under_way() -> tuple[int, int] | None:
    """(runs deleted, runs to delete) over every deletion not yet finished, whichever tab started it; None
    where none is under way."""
    with _lock:
        under_way = [job for job in _deletions.values() if not job.finished]
        return (sum(job.done for job in under_way), sum(job.total for job in under_way)) if under_way else None


def forget(key: int) -> None:
    with _lock:
        _deletions.pop(key, None)


def _delete(key: int, run_ids: list[int], db_url: str | None) -> None:
    def progress(done: int, total: int) -> None:
        with _lock:
            _deletions[key].done, _deletions[key].total = done, total

    try:
        deleted, refused = delete_runs_and_files(run_ids, db_url=db_url, progress=progress)
    except Exception as exc:  # noqa: BLE001 - said on the page in one line; the runs not reached are left whole
        with _lock:
            job = _deletions[key]
            line = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            job.refused = [f"deleting stopped after {job.done:,} of {job.total:,} runs: {line}"]
            job.finished, job.ended_at = True, time.monotonic()
        return
    with _lock:
        job = _deletions[key]
        job.deleted, job.refused, job.done, job.finished = deleted, refused, len(deleted), True
        job.ended_at = time.monotonic()

"""Searches in the database: the row of each (its base config, space, notes, status and the process driving it
now) and its trials' runs. The study that draws the trials is Optuna's (db/search_study.py).

    search_id = create_search(engine, "hyper", config.to_dict(), space.to_dict(), notes)
    claim_driver(engine, search_id)              # False where another live process drives it
    trial_runs(engine, search_id)                # {trial number: RunRecord-like dict}
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select, update

from db.connection import session_scope
from db.run_state import is_same_process, process_alive, process_start
from db.tables import SEARCH_STATUSES, Run, Search, utcnow

STUDY_PREFIX = "parallax-search-"


@dataclass(frozen=True)
class SearchRecord:
    id: int
    created_at: datetime
    finished_at: datetime | None
    kind: str
    study_name: str
    status: str
    config: dict[str, Any]
    space: dict[str, Any]
    notes: list[str]
    driver_pid: int | None
    driver_host: str | None
    driver_start: str | None

    @property
    def driven_here_by_a_live_process(self) -> bool:
        """Whether a process on this machine drives the search now (the one that recorded itself)."""
        if self.driver_pid is None or self.driver_host != socket.gethostname():
            return False
        same = is_same_process(self.driver_pid, self.driver_start)
        return process_alive(self.driver_pid) if same is None else same


def _record(row: Search) -> SearchRecord:
    return SearchRecord(row.id, row.created_at, row.finished_at, row.kind, row.study_name, row.status,
                        dict(row.config), dict(row.space), list(row.notes or []), row.driver_pid, row.driver_host,
                        row.driver_start)


def create_search(engine: Engine, kind: str, config: dict[str, Any], space: dict[str, Any],
                  notes: list[str] | None = None) -> int:
    """Record a search (running, no driver yet); its study is named after its id."""
    with session_scope(engine) as session:
        search = Search(created_at=utcnow(), kind=kind, study_name="", status="running", config=dict(config),
                        space=dict(space), notes=list(notes or []))
        session.add(search)
        session.flush()
        search.study_name = f"{STUDY_PREFIX}{search.id}"
        return search.id


def get_search(engine: Engine, search_id: int) -> SearchRecord | None:
    with session_scope(engine) as session:
        row = session.get(Search, search_id)
        return None if row is None else _record(row)


def list_searches(engine: Engine) -> list[SearchRecord]:
    """Every search, newest first."""
    with session_scope(engine) as session:
        return [_record(row) for row in session.scalars(select(Search).order_by(Search.id.desc()))]


def claim_driver(engine: Engine, search_id: int) -> bool:
    """Make this process the search's driver, unless a live process on this machine already is; whether it did.
    A driver on another machine is taken over: only its own machine could tell whether it still lives."""
    record = get_search(engine, search_id)
    if record is None:
        raise LookupError(f"no search with id {search_id}")
    if record.driven_here_by_a_live_process and record.driver_pid != os.getpid():
        return False
    with session_scope(engine) as session:
        changed = session.execute(
            update(Search).where(Search.id == search_id, Search.driver_pid.is_(None) if record.driver_pid is None
                                 else Search.driver_pid == record.driver_pid)
            .values(driver_pid=os.getpid(), driver_host=socket.gethostname(), driver_start=process_start(os.getpid()),
                    status="running", finished_at=None)
        ).rowcount
    return changed == 1


def release_driver(engine: Engine, search_id: int, status: str) -> None:
    """This process stops driving the search, leaving it ``status`` (finished, or stopped to be resumed)."""
    if status not in SEARCH_STATUSES:
        raise ValueError(f"search status {status!r} is not allowed: one of {', '.join(SEARCH_STATUSES)}")
    with session_scope(engine) as session:
        session.execute(update(Search).where(Search.id == search_id, Search.driver_pid == os.getpid())
                        .values(driver_pid=None, driver_host=None, driver_start=None, status=status,
                                finished_at=utcnow() if status != "running" else None))


def mark_stopped(engine: Engine, search_id: int) -> None:
    """The search stopped with no driver (its last one is gone): it waits to be resumed."""
    with session_scope(engine) as session:
        session.execute(update(Search).where(Search.id == search_id)
                        .values(status="stopped", driver_pid=None, driver_host=None, driver_start=None,
                                finished_at=utcnow()))


def search_log(engine: Engine, search_id: int):
    """Where a detached driver of the search writes: ``PARALLAX_HOME/runs/<database key>/search-N.log``."""
    from contract.environment import parallax_home
    from db.folders import database_key

    return parallax_home() / "runs" / database_key(engine)[0] / f"search-{search_id}.log"


def add_search_notes(engine: Engine, search_id: int, notes: list[str]) -> None:
    """Append notes the search has not said yet."""
    with session_scope(engine) as session:
        row = session.get(Search, search_id)
        row.notes = list(dict.fromkeys([*(row.notes or []), *notes]))


def trial_runs(engine: Engine, search_id: int) -> dict[int, dict[str, Any]]:
    """The search's runs by trial number: id, status, error, config, created_at and finished_at."""
    with session_scope(engine) as session:
        rows = session.execute(
            select(Run.search_trial, Run.id, Run.status, Run.error, Run.config, Run.created_at, Run.started_at,
                   Run.finished_at).where(Run.search_id == search_id).order_by(Run.id))
        return {row.search_trial: {"id": row.id, "status": row.status, "error": row.error, "config": row.config,
                                   "created_at": row.created_at, "started_at": row.started_at,
                                   "finished_at": row.finished_at} for row in rows}

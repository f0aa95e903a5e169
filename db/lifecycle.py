"""Run state changes that can race, and finding runs whose process has died.

Several processes touch a run's state: its worker, a ``cancel`` from another terminal, the
dashboard marking a dead run ``lost``. Every change from an active state (queued, running) is a
conditional UPDATE, so the first writer wins and a finished run is never reopened or relabelled.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, select, update

from db.engine import session_scope, try_write
from db.models import TERMINAL_STATUSES, Run, utcnow

ACTIVE_STATUSES = ("queued", "running")
# A worker beats every few seconds; a minute of silence from a run on another host means it is gone.
STALE_AFTER = timedelta(seconds=60)


@dataclass(frozen=True)
class ActiveRun:
    id: int
    status: str
    devices: tuple[str, ...]
    pid: int | None
    host: str | None
    heartbeat_at: datetime | None
    created_at: datetime

    @property
    def uses_cpu(self) -> bool:
        return any(d == "cpu" for d in self.devices)

    @property
    def gpus(self) -> frozenset[str]:
        return frozenset(d for d in self.devices if d.startswith("cuda"))


def claim(engine: Engine, run_id: int) -> bool:
    """queued -> running; False if the run is no longer queued (e.g. cancelled meanwhile)."""
    now = utcnow()
    with session_scope(engine) as session:
        result = session.execute(
            update(Run).where(Run.id == run_id, Run.status == "queued")
            .values(status="running", started_at=now, heartbeat_at=now)
        )
        return result.rowcount == 1


def finish(engine: Engine, run_id: int, status: str, error: str | None = None) -> bool:
    """End an active run with ``status``; False if it had already ended (the first end stands)."""
    if status not in TERMINAL_STATUSES:
        raise ValueError(f"status {status!r} does not end a run; allowed: {', '.join(sorted(TERMINAL_STATUSES))}")
    values: dict = {"status": status, "finished_at": utcnow()}
    if error is not None:
        values["error"] = error
    with session_scope(engine) as session:
        result = session.execute(
            update(Run).where(Run.id == run_id, Run.status.in_(ACTIVE_STATUSES)).values(**values)
        )
        return result.rowcount == 1


def heartbeat(engine: Engine, run_id: int) -> bool:
    """Stamp the run as alive; skipped (False) while another process holds the database locked,
    since the next beat follows within seconds and a run is judged lost only after a minute."""
    return try_write(
        engine, update(Run).where(Run.id == run_id, Run.status.in_(ACTIVE_STATUSES)).values(heartbeat_at=utcnow())
    )


def set_progress(engine: Engine, run_id: int, *, epoch: int, step: int, total_steps: int) -> bool:
    """Record (epoch, step of total); skipped (False) while the database is locked: training
    must not wait for a progress bar, and the next update follows within a second."""
    return try_write(
        engine, update(Run).where(Run.id == run_id)
        .values(progress_epoch=epoch, progress_step=step, progress_total_steps=total_steps)
    )


def active_runs(engine: Engine) -> list[ActiveRun]:
    """Queued and running runs in launch order, with the devices each holds or wants."""
    with session_scope(engine) as session:
        rows = session.execute(
            select(Run.id, Run.status, Run.config, Run.pid, Run.host, Run.heartbeat_at, Run.created_at)
            .where(Run.status.in_(ACTIVE_STATUSES)).order_by(Run.id)
        ).all()
    return [
        ActiveRun(r.id, r.status, tuple((r.config or {}).get("devices") or ()), r.pid, r.host, r.heartbeat_at, r.created_at)
        for r in rows
    ]


def process_alive(pid: int) -> bool:
    """True if ``pid`` runs on this host and is not a zombie (a dead child nobody reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except OSError:
        return True  # no /proc (not Linux): kill(0) succeeding is the best we know


def mark_lost_runs(engine: Engine) -> list[int]:
    """Mark active runs whose process is gone as ``lost``; returns their ids.

    On this host the pid answers directly (a process killed from outside, by ``kill -9`` or the
    OOM killer, never writes its own end). For another host only the heartbeat can tell.
    """
    here = socket.gethostname()
    now = utcnow()
    lost = []
    for run in active_runs(engine):
        last_sign = run.heartbeat_at or run.created_at
        stale = now - last_sign > STALE_AFTER
        if run.pid is not None and run.host == here:
            gone = not process_alive(run.pid) or stale  # stale with a live pid: the pid was reused
            where = f"process {run.pid} on {here}"
        else:
            gone = stale
            where = f"process {run.pid} on {run.host}" if run.pid else "its process"
        if gone and finish(
            engine, run.id, "lost",
            error=f"{where} is gone without recording how the run ended (killed from outside, e.g. "
            f"kill -9 or the out-of-memory killer; last heartbeat {last_sign.isoformat(timespec='seconds')})",
        ):
            lost.append(run.id)
    return lost

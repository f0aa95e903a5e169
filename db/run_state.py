"""Run state changes that can race, and finding runs whose process has died.

Several processes touch a run's state: its supervisor, a ``cancel`` from another terminal, the
dashboard marking a dead run ``lost``. Every change from an active state (queued, running) is a
conditional UPDATE, so the first writer wins and a finished run is never reopened or relabelled.

With a shared database (PostgreSQL) the run may live on another machine: its pid means nothing
here, so only its heartbeat can tell whether it is gone. Heartbeats are then stamped and judged
by the database server's clock, so clocks that differ between machines do not matter.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, func, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from db.connection import full_reason, read_only_reason, session_scope, try_write
from db.tables import TERMINAL_STATUSES, Run, utcnow
from db.notify import notify

ACTIVE_STATUSES = ("queued", "running")
HEARTBEAT_INTERVAL_S = 5.0  # how often a run's main process beats (trainer_backend.control.lifecycle.Heartbeat)
# Six missed beats: a run whose heartbeat is older is gone. Long enough for a slow write or a
# supervisor still starting up (its launcher stamped created_at), short enough that a dead run on
# another machine frees its place within half a minute.
STALE_AFTER = timedelta(seconds=6 * HEARTBEAT_INTERVAL_S)
# On this host a live pid outweighs a late heartbeat: beats are skipped while another process
# holds SQLite locked (up to PARALLAX_DB_LOCK_WAIT_S, 300 s by default). Only a live pid silent
# for this long is taken for a reused pid (where the process's start was not recorded).
PID_REUSED_AFTER = timedelta(minutes=10)
# Where a run keeps the start of its process (``process_start``), in ``Run.measurements``.
PROCESS_START_KEY = "process_start"


@dataclass(frozen=True)
class ActiveRun:
    id: int
    status: str
    devices: tuple[str, ...]
    pid: int | None
    host: str | None
    heartbeat_at: datetime | None
    created_at: datetime
    process_start: str | None = None

    @property
    def uses_cpu(self) -> bool:
        return any(d == "cpu" for d in self.devices)

    @property
    def gpus(self) -> frozenset[str]:
        return frozenset(d for d in self.devices if d.startswith("cuda"))


def claim(engine: Engine, run_id: int) -> bool:
    """queued -> running; False if the run is no longer queued (e.g. cancelled meanwhile)."""
    with session_scope(engine) as session:
        result = session.execute(
            update(Run).where(Run.id == run_id, Run.status == "queued")
            # A resumed run keeps its first start: its times and charts run on across the gap.
            .values(status="running", started_at=func.coalesce(Run.started_at, utcnow()), heartbeat_at=_clock(session))
        )
        return result.rowcount == 1


def finish(engine: Engine, run_id: int, status: str, error: str | None = None) -> bool:
    """End an active run with ``status``; False if it had already ended (the first end stands). The
    process that ends it posts the end to the home's webhooks (``notify``), in the background."""
    if status not in TERMINAL_STATUSES:
        raise ValueError(f"status {status!r} does not end a run; allowed: {', '.join(sorted(TERMINAL_STATUSES))}")
    values: dict = {"status": status, "finished_at": utcnow()}
    if error is not None:
        values["error"] = error
    with session_scope(engine) as session:
        ended = session.execute(
            update(Run).where(Run.id == run_id, Run.status.in_(ACTIVE_STATUSES)).values(**values)
        ).rowcount == 1
    if ended:  # told once, by the process whose write ended the run
        notify(engine, run_id, f"run.{status}", error)
    return ended


RESUMABLE_ENDS = ("failed", "cancelled", "lost")


def reopen(engine: Engine, run_id: int) -> bool:
    """An ended run (failed, cancelled or lost) back to queued, to be resumed as the same run; False if it
    is not one of those now (another process resumed it first, or it completed)."""
    with session_scope(engine) as session:
        return session.execute(
            update(Run).where(Run.id == run_id, Run.status.in_(RESUMABLE_ENDS))
            .values(status="queued", error=None, finished_at=None, pid=None, heartbeat_at=None)
        ).rowcount == 1


def heartbeat(engine: Engine, run_id: int) -> bool:
    """Stamp the run as alive. False if it is no longer active (cancelled or marked lost meanwhile),
    or if the beat was skipped because another process held the database locked: the next beat
    follows within seconds, and a run is judged lost only after ``STALE_AFTER``."""
    stamp = func.now() if engine.dialect.name == "postgresql" else utcnow()
    return try_write(
        engine, update(Run).where(Run.id == run_id, Run.status.in_(ACTIVE_STATUSES)).values(heartbeat_at=stamp)
    )


def database_now(engine: Engine) -> datetime:
    """The time heartbeats are judged by: the server's clock on PostgreSQL, this machine's on SQLite."""
    with session_scope(engine) as session:
        clock = _clock(session)
        return clock if isinstance(clock, datetime) else session.scalar(select(clock))


def _clock(session: Session):
    # PostgreSQL is shared by machines whose clocks may differ: its own now() is the one clock
    # that every writer and reader of a heartbeat agrees on. SQLite lives on one machine.
    if session.get_bind().dialect.name == "postgresql":
        return func.now()
    return utcnow()


def set_progress(engine: Engine, run_id: int, *, epoch: int, step: int, total_steps: int) -> bool:
    """Record (epoch, step of total); skipped (False) while the database is locked: training
    must not wait for a progress bar, and the next update follows within a second."""
    return try_write(
        engine, update(Run).where(Run.id == run_id)
        .values(progress_epoch=epoch, progress_step=step, progress_total_steps=total_steps)
    )


def active_runs(engine: Engine) -> list[ActiveRun]:
    """Queued and running runs on this machine's queue in launch order, with the devices each holds or wants.
    A run sent to Slurm holds no device here, and Slurm, not its pid or heartbeat, says when it has gone
    (trainer_backend/control/slurm_status.py)."""
    with session_scope(engine) as session:
        rows = session.execute(
            select(Run.id, Run.status, Run.config, Run.pid, Run.host, Run.heartbeat_at, Run.created_at,
                   Run.measurements)
            .where(Run.status.in_(ACTIVE_STATUSES)).order_by(Run.id)
        ).all()
    return [
        ActiveRun(r.id, r.status, tuple((r.config or {}).get("devices") or ()), r.pid, r.host, r.heartbeat_at, r.created_at,
                  (r.measurements or {}).get(PROCESS_START_KEY))
        for r in rows if (r.config or {}).get("where") != "slurm"
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


def process_start(pid: int) -> str | None:
    """Which process ``pid`` is on this host, as "<boot id>:<start time in clock ticks since boot>":
    a pid is reused once its process has ended, but no two processes of one boot start at the same
    tick with the same pid. None where /proc cannot tell (the process is gone, or not Linux)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot, open(f"/proc/{pid}/stat") as stat:
            return f"{boot.read().strip()}:{int(stat.read().rsplit(')', 1)[1].split()[19])}"
    except (OSError, IndexError, ValueError):
        return None


def is_same_process(pid: int, recorded_start: str | None) -> bool | None:
    """Whether ``pid`` is still the process whose start was recorded (``process_start``); None
    when that cannot be told (nothing recorded, or no /proc)."""
    if not recorded_start:
        return None
    now = process_start(pid)
    return None if now is None and process_alive(pid) else now == recorded_start


def mark_lost_runs(engine: Engine) -> list[int]:
    """Mark active runs whose process is gone as ``lost``; returns their ids.

    On this host the pid answers directly (a process killed from outside, by ``kill -9`` or the
    OOM killer, never writes its own end). For a run on another host only the heartbeat can
    tell: it is lost when its last beat is older than ``STALE_AFTER``.
    """
    here = socket.gethostname()
    runs = active_runs(engine)
    if not runs:
        return []
    now = database_now(engine)
    lost = []
    for run in runs:
        last_sign = run.heartbeat_at or run.created_at
        stale = now - last_sign > STALE_AFTER
        last = f"last heartbeat {last_sign.isoformat(timespec='seconds')}"
        if run.pid is not None and run.host == here:
            # A pid now held by another process (a later run's, say) is the run's no longer.
            gone = (not process_alive(run.pid) or is_same_process(run.pid, run.process_start) is False
                    or now - last_sign > PID_REUSED_AFTER)
            error = (f"process {run.pid} on {here} is gone without recording how the run ended (killed from "
                     f"outside, e.g. kill -9 or the out-of-memory killer; {last})")
        else:
            gone = stale
            where = f"process {run.pid} on {run.host}" if run.pid and run.host else "its process"
            error = (f"no heartbeat from {where} for {int((now - last_sign).total_seconds())} s: the process or "
                     f"its machine stopped, or lost its connection to the database ({last})")
        try:
            if gone and finish(engine, run.id, "lost", error=error):
                lost.append(run.id)
        except DBAPIError as exc:
            if full_reason(exc) is None and read_only_reason(exc) is None:
                raise
            break  # a full disk or a read-only database: the runs are read as they are; the next read with room marks them
    return lost

"""The run of a torchrun job: one row for every process on every machine, found again after a restart.

    record_job(engine, run_id, elastic_run_id="exp1", nodes=2, hosts=["gpu-a", "gpu-b"])
    found = find_job_run(engine, "exp1")          # (run_id, status) of the job's newest run, or None
    resume_job_run(engine, run_id, pid=..., host=..., nodes=2, hosts=[...])   # False if it had ended

Rank 0 of the job writes these; under ``torchrun --max-restarts N`` a restarted rank 0 (possibly on
another machine) finds the run by torchrun's job id and carries on in the same row.
"""

from __future__ import annotations

from sqlalchemy import Engine, func, select, update

from db.connection import session_scope
from db.run_state import PROCESS_START_KEY, process_start
from db.tables import Run, utcnow

# A run left running by a failed attempt, or marked lost while torchrun restarted the job (its
# rank 0 had died), is picked up again; cancelled, failed and completed runs stay as they are.
RESUMABLE_STATUSES = ("running", "lost")
# What a new job may take over when asked to (--resume-job): a run that ended without finishing
# its epochs. A running run belongs to a job still alive; it is never taken from it.
TAKEOVER_STATUSES = ("lost", "failed")


def record_job(engine: Engine, run_id: int, *, elastic_run_id: str, nodes: int, hosts: list[str]) -> None:
    with session_scope(engine) as session:
        result = session.execute(
            update(Run).where(Run.id == run_id)
            .values(elastic_run_id=elastic_run_id, nodes=nodes, hosts=list(hosts))
        )
        if result.rowcount == 0:
            raise LookupError(f"no run with id {run_id}")


def find_job_run(engine: Engine, elastic_run_id: str) -> tuple[int, str] | None:
    """(run id, status) of the newest run of torchrun job ``elastic_run_id``, or None."""
    with session_scope(engine) as session:
        row = session.execute(
            select(Run.id, Run.status).where(Run.elastic_run_id == elastic_run_id).order_by(Run.id.desc()).limit(1)
        ).first()
    return None if row is None else (row.id, row.status)


def resume_job_run(engine: Engine, run_id: int, *, pid: int, host: str, nodes: int, hosts: list[str],
                   statuses: tuple[str, ...] = RESUMABLE_STATUSES) -> bool:
    """Make a restarted job's run running again under its new rank 0; False if it has ended
    meanwhile (a cancel, say), so a restart never reopens a run that was finished on purpose.
    ``statuses``: those it may be taken over from (``TAKEOVER_STATUSES`` for ``--resume-job``)."""
    with session_scope(engine) as session:
        # The new process's start goes with its pid, in one write: a reader seeing the pid with
        # the old process's start would take the pid for reused and mark the run lost.
        measurements = session.scalar(select(Run.measurements).where(Run.id == run_id)) or {}
        result = session.execute(
            update(Run).where(Run.id == run_id, Run.status.in_(statuses))
            .values(status="running", started_at=func.coalesce(Run.started_at, utcnow()), finished_at=None, error=None,
                    heartbeat_at=utcnow(),
                    pid=pid, host=host, nodes=nodes, hosts=list(hosts),
                    measurements={**measurements, PROCESS_START_KEY: process_start(pid)})
        )
        return result.rowcount == 1

"""Read and write a run's profiler output: op tables, step breakdowns and gzipped traces.

Traces are read one at a time by (run, rank) and never by a listing: they are megabytes each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Engine, delete, func, select

from db.connection import session_scope
from db.tables import ProfileOp, ProfileStep, ProfileTrace

OP_FIELDS = ("name", "calls", "self_cpu_us", "cpu_total_us", "self_device_us", "device_total_us",
             "self_cpu_memory_bytes", "self_device_memory_bytes")
STEP_FIELDS = ("step", "data_loading_ms", "forward_ms", "backward_ms", "optimizer_step_ms",
               "communication_ms", "other_ms", "total_ms")


def save_profile(engine: Engine, run_id: int, rank: int, *, ops: Iterable[Mapping[str, Any]],
                 steps: Iterable[Mapping[str, Any]], trace_gz: bytes, trace_bytes: int) -> None:
    """Store one rank's profile, replacing any earlier one of the same rank."""
    with session_scope(engine) as session:
        for table in (ProfileOp, ProfileStep, ProfileTrace):
            session.execute(delete(table).where(table.run_id == run_id, table.rank == rank))
        session.add_all(ProfileOp(run_id=run_id, rank=rank, **{k: op[k] for k in OP_FIELDS}) for op in ops)
        session.add_all(ProfileStep(run_id=run_id, rank=rank, **{k: s[k] for k in STEP_FIELDS}) for s in steps)
        session.add(ProfileTrace(run_id=run_id, rank=rank, trace_gz=trace_gz, trace_bytes=trace_bytes))


def read_ops(engine: Engine, run_id: int) -> list[dict[str, Any]]:
    """Every rank's op table, heaviest first within a rank."""
    columns = [ProfileOp.rank, *(getattr(ProfileOp, f) for f in OP_FIELDS)]
    with session_scope(engine) as session:
        rows = session.execute(
            select(*columns).where(ProfileOp.run_id == run_id)
            .order_by(ProfileOp.rank, (ProfileOp.self_cpu_us + ProfileOp.self_device_us).desc())
        )
        return [row._asdict() for row in rows]


def read_steps(engine: Engine, run_ids: Iterable[int]) -> list[dict[str, Any]]:
    """Per-step breakdowns of the given runs, by run, rank and step."""
    columns = [ProfileStep.run_id, ProfileStep.rank, *(getattr(ProfileStep, f) for f in STEP_FIELDS)]
    with session_scope(engine) as session:
        rows = session.execute(
            select(*columns).where(ProfileStep.run_id.in_(list(run_ids)))
            .order_by(ProfileStep.run_id, ProfileStep.rank, ProfileStep.step)
        )
        return [row._asdict() for row in rows]


def list_traces(engine: Engine, run_id: int) -> list[dict[str, Any]]:
    """(rank, uncompressed and compressed size) of each stored trace, without loading one."""
    with session_scope(engine) as session:
        rows = session.execute(
            select(ProfileTrace.rank, ProfileTrace.trace_bytes, func.length(ProfileTrace.trace_gz).label("gzip_bytes"))
            .where(ProfileTrace.run_id == run_id).order_by(ProfileTrace.rank)
        )
        return [row._asdict() for row in rows]


def read_trace(engine: Engine, run_id: int, rank: int) -> bytes:
    """The gzipped Chrome trace of one rank of a run."""
    with session_scope(engine) as session:
        data = session.scalar(
            select(ProfileTrace.trace_gz).where(ProfileTrace.run_id == run_id, ProfileTrace.rank == rank)
        )
    if data is None:
        raise LookupError(f"run {run_id} has no profiler trace for rank {rank}")
    return data


def profiled_runs(engine: Engine, run_ids: Iterable[int] | None = None) -> set[int]:
    """Which runs (of ``run_ids``, or all) have a stored profile."""
    query = select(ProfileTrace.run_id).distinct()
    if run_ids is not None:
        query = query.where(ProfileTrace.run_id.in_(list(run_ids)))
    with session_scope(engine) as session:
        return set(session.scalars(query))

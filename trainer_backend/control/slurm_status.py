"""What Slurm says of the runs sent to it: one batched ``squeue --json`` for every reader, at most every
``POLL_INTERVAL_S``, and the end of a job that left the queue without its run recording one.

    jobs = queue()                        # {job id: JobState}, shared by every tab and thread of this process
    watch_slurm_runs(engine)              # runs whose job is gone: marked with Slurm's final state

``squeue --json`` returns every job of the cluster (it ignores ``-j`` in Slurm 22.05), so one call serves all
runs; a process-wide cache with a lock makes any number of readers cost one call per interval. The JSON
differs between Slurm versions (22.05: ``job_state`` a text and ``exit_code`` the raw wait status; 23.02 and
later: lists and objects), so every field is read defensively. A job that has left the queue is looked up once
with ``scontrol show job`` (there is no accounting to ask on every cluster); where nothing answers, its run is
``lost`` with that reason.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import dataclass

from sqlalchemy import update

from db import run_state as state
from db import store
from db.connection import session_scope
from db.tables import Run

from trainer_backend.control.slurm_job import SlurmUnavailable, slurm_command, slurm_info

POLL_INTERVAL_S = 10.0
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE", "REVOKED")


@dataclass(frozen=True)
class JobState:
    """One job as Slurm reports it: its state (PENDING, RUNNING, ..., COMPLETED, FAILED, TIMEOUT), the
    reason Slurm gives (Resources, Priority, BeginTime, ... or None), and for an ended job its exit code."""

    job_id: str
    state: str
    reason: str | None = None
    exit_code: int | None = None
    signal: int | None = None

    @property
    def ended(self) -> bool:
        return self.state in ENDED


_lock = threading.Lock()
_cache: dict = {"at": -math.inf, "jobs": {}, "problem": None}
squeue_calls = 0  # how many times this process has run squeue (the poll's cost, read by its benchmark test)


def _number(value) -> int | None:
    """22.05 gives a number; 23.02+ gives {"set": true, "infinite": false, "number": N}."""
    if isinstance(value, dict):
        return value.get("number") if value.get("set", True) and not value.get("infinite") else None
    if isinstance(value, bool):
        return None
    return value if isinstance(value, int) else None


def _text(value) -> str | None:
    if isinstance(value, list):  # 23.02+: job_state is a list of flags, the state first
        value = value[0] if value else None
    return value if isinstance(value, str) and value else None


def _exit(value) -> tuple[int | None, int | None]:
    """(exit code, signal): 22.05's raw wait status (exit 3 -> 768), or 23.02+'s {"return_code", "signal"}."""
    if isinstance(value, dict):
        signal = value.get("signal")
        return _number(value.get("return_code")), _number(signal.get("id")) if isinstance(signal, dict) else None
    raw = _number(value)
    if raw is None:
        return None, None
    return (raw >> 8) & 0xFF, (raw & 0x7F) or None


def _task_ids(text: str) -> list[int]:
    """'0-3%2' or '1,3-4' -> the array's task ids (a pending array shows its tasks as one record)."""
    ids = []
    for part in text.split("%")[0].split(","):
        if re.fullmatch(r"\d+", part):
            ids.append(int(part))
        elif m := re.fullmatch(r"(\d+)-(\d+)(?::(\d+))?", part):
            ids += list(range(int(m[1]), int(m[2]) + 1, int(m[3] or 1)))
    return ids


def parse_squeue_json(text: str) -> dict[str, JobState]:
    """{job id: JobState} from ``squeue --json``; array tasks are keyed "<array job id>_<task>"."""
    try:
        document = json.loads(text)
    except ValueError:
        return {}
    jobs = {}
    for job in document.get("jobs", []) if isinstance(document, dict) else []:
        if not isinstance(job, dict):
            continue
        state = _text(job.get("job_state")) or "UNKNOWN"
        reason = _text(job.get("state_reason"))
        code, signal = _exit(job.get("exit_code"))
        each = JobState("", state, None if reason in (None, "None") else reason, code, signal)
        array_id, task = _number(job.get("array_job_id")), _number(job.get("array_task_id"))
        pending_tasks = _text(job.get("array_task_string"))
        if array_id and pending_tasks:
            for task_id in _task_ids(pending_tasks):
                jobs[f"{array_id}_{task_id}"] = JobState(f"{array_id}_{task_id}", *_rest(each))
        elif array_id and task is not None:
            jobs[f"{array_id}_{task}"] = JobState(f"{array_id}_{task}", *_rest(each))
        job_id = _number(job.get("job_id"))
        if job_id is not None and not pending_tasks:
            jobs.setdefault(str(job_id), JobState(str(job_id), *_rest(each)))
    return jobs


def _rest(job: JobState) -> tuple:
    return job.state, job.reason, job.exit_code, job.signal


def queue(*, interval_s: float = POLL_INTERVAL_S, now: float | None = None) -> dict[str, JobState]:
    """Every job squeue knows, from one ``squeue --json`` shared by every caller of this process within
    ``interval_s``. Raises SlurmUnavailable (one line) where squeue cannot answer."""
    global squeue_calls
    now = time.monotonic() if now is None else now
    with _lock:
        if now - _cache["at"] < interval_s:
            if _cache["problem"] is not None:
                raise SlurmUnavailable(_cache["problem"])
            return _cache["jobs"]
        squeue_calls += 1
        problem, jobs = None, {}
        try:
            result = slurm_command("squeue", "--json")
            if result.returncode != 0:
                problem = f"squeue failed: {(result.stderr or result.stdout).strip()[:300]}"
            else:
                jobs = parse_squeue_json(result.stdout)
        except SlurmUnavailable as exc:
            problem = str(exc)
        _cache.update(at=now, jobs=jobs, problem=problem)
    if problem is not None:
        raise SlurmUnavailable(problem)
    return jobs


def forget_queue() -> None:
    """The next ``queue()`` asks squeue again (after a submit or cancel from this process)."""
    with _lock:
        _cache["at"] = -math.inf


def final_state(job_id: str) -> JobState | None:
    """The state Slurm keeps of a job after it left squeue (``scontrol show job``, until MinJobAge);
    None where Slurm no longer knows it."""
    try:
        result = slurm_command("scontrol", "show", "job", "--oneliner", job_id)
    except SlurmUnavailable:
        return None
    if result.returncode != 0:
        return None
    fields = dict(part.split("=", 1) for part in result.stdout.split() if "=" in part)
    if "JobState" not in fields:
        return None
    code, signal = None, None
    if m := re.fullmatch(r"(\d+):(\d+)", fields.get("ExitCode", "")):
        code, signal = int(m[1]), int(m[2]) or None
    reason = fields.get("Reason")
    return JobState(job_id, fields["JobState"], None if reason in (None, "None") else reason, code, signal)


def describe_end(job: JobState | None, job_id: str, run_id: int) -> tuple[str, str]:
    """(run status, error) for a job that ended without its run recording the end."""
    if job is None:
        return "lost", (f"Slurm job {job_id} left the queue and Slurm no longer knows it (squeue and scontrol show "
                        "job do not list it), without the run recording how it ended")
    code = f"exit code {job.exit_code}" + (f", signal {job.signal}" if job.signal else "") \
        if job.exit_code is not None else "no exit code"
    why = f"; reason {job.reason}" if job.reason else ""
    if job.state == "CANCELLED":
        return "cancelled", f"Slurm job {job_id} was cancelled (scancel, or an administrator){why}"
    if job.state == "TIMEOUT":
        return "failed", (f"Slurm job {job_id} reached its time limit (TIMEOUT, {code}); the run's last finished "
                          f"epoch is kept: `parallax resume {run_id}` continues it")
    if job.state in ("PREEMPTED", "NODE_FAIL", "BOOT_FAIL"):
        return "lost", f"Slurm job {job_id} ended {job.state} ({code}{why}) and was not requeued"
    if job.state == "COMPLETED":
        return "lost", f"Slurm job {job_id} ended COMPLETED ({code}) without the run recording how it ended"
    return "failed", f"Slurm job {job_id} ended {job.state} ({code}{why})"


def watch_slurm_runs(engine, *, interval_s: float = POLL_INTERVAL_S) -> dict[int, JobState]:
    """Bring the active runs sent to Slurm in line with Slurm: a job requeued (PENDING again) puts its run back
    to queued; a job that has ended without its run recording the end marks it (``describe_end``). Returns
    {run id: JobState} of the active Slurm runs, for the pages to show (PENDING's reason, say); empty where
    there are none (no squeue is run then) or Slurm does not answer."""
    runs = _active_slurm_runs(engine)
    if not runs:
        return {}
    try:
        jobs = queue(interval_s=interval_s)
    except SlurmUnavailable:
        return {}
    shown = {}
    for run_id, status, job_id in runs:
        job = jobs.get(job_id)
        if job is not None and not job.ended:
            shown[run_id] = job
            if job.state == "PENDING" and status == "running":
                _requeued(engine, run_id)
            continue
        final = job if job is not None else final_state(job_id)
        if final is not None and not final.ended:
            shown[run_id] = final  # between squeue's answer and now it changed: the next poll sees it
            continue
        current = store.get_run(engine, run_id)
        if current is not None and current.status in state.ACTIVE_STATUSES:
            ended, error = describe_end(final, job_id, run_id)
            state.finish(engine, run_id, ended, error=error)
    return shown


def _active_slurm_runs(engine) -> list[tuple[int, str, str]]:
    """(run id, status, job id) of every queued or running run submitted to Slurm."""
    from sqlalchemy import select

    with session_scope(engine) as session:
        rows = session.execute(select(Run.id, Run.status, Run.config, Run.measurements)
                               .where(Run.status.in_(state.ACTIVE_STATUSES))).all()
    found = []
    for row in rows:
        if (row.config or {}).get("where") != "slurm":
            continue
        info = slurm_info(row)
        if info and info.get("job_id"):
            found.append((row.id, row.status, str(info["job_id"])))
    return found


def _requeued(engine, run_id: int) -> None:
    """A running run whose job Slurm requeued waits in the queue again."""
    with session_scope(engine) as session:
        session.execute(update(Run).where(Run.id == run_id, Run.status == "running")
                        .values(status="queued", pid=None, heartbeat_at=None))


@dataclass(frozen=True)
class Partition:
    """A partition as ``sinfo`` shows it: its nodes and GPUs, and how many of each are free now."""

    name: str
    default: bool
    nodes: int
    free_nodes: int
    gpus: int
    free_gpus: int


def _gpu_count(gres: str) -> int:
    """'gpu:a100:4(S:0-1),shard:8' -> 4; '(null)' -> 0."""
    return sum(int(m[1]) for m in re.finditer(r"gpu(?::[^:,()]+)?:(\d+)", gres or ""))


def partitions() -> list[Partition] | str:
    """The cluster's partitions with their free nodes and GPUs (for the Launch form), or the one-line reason
    Slurm is not offered here (no client, no controller answering, no partition)."""
    try:
        result = slurm_command("sinfo", "-h", "-N", "-O", "PartitionName:200,StateCompact:20,Gres:200,GresUsed:200")
    except SlurmUnavailable as exc:
        return str(exc)
    if result.returncode != 0:
        return f"sinfo failed: {(result.stderr or result.stdout).strip()[:200]}"
    found: dict[str, dict] = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, node_state = parts[0], parts[1]
        gres, used = (parts[2] if len(parts) > 2 else ""), (parts[3] if len(parts) > 3 else "")
        entry = found.setdefault(name.rstrip("*"), {"default": name.endswith("*"), "nodes": 0, "free_nodes": 0,
                                                    "gpus": 0, "free_gpus": 0})
        entry["nodes"] += 1
        up = not any(flag in node_state for flag in ("down", "drain", "fail", "maint", "*"))
        entry["free_nodes"] += node_state == "idle"
        entry["gpus"] += _gpu_count(gres)
        entry["free_gpus"] += max(0, _gpu_count(gres) - _gpu_count(used)) if up else 0
    if not found:
        return "sinfo lists no partition: this cluster has none this user may use"
    # -O's PartitionName leaves out the default's "*" that %P shows.
    names = slurm_command("sinfo", "-h", "-o", "%P").stdout.split()
    for name in names:
        if name.endswith("*") and name[:-1] in found:
            found[name[:-1]]["default"] = True
    return [Partition(name, **values) for name, values in found.items()]

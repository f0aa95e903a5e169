"""The Run page's part for a run sent to Slurm: its job, what Slurm says of it (PENDING's reason), the sbatch
script kept with the run, and the tail of the job's output.

    show_job(run)       # draws nothing for a run trained on this machine

What Slurm says comes from the process-wide poll (trainer_backend/control/slurm_status.py): one squeue for every
tab, at most every 10 s.
"""

from __future__ import annotations

import streamlit as st

from db.folders import run_folder
from trainer_backend.control.slurm_job import SCRIPT_FILE, SlurmUnavailable, read_job_log, slurm_info
from trainer_backend.control.slurm_status import queue
from ui import state

LOG_TAIL_BYTES = 64 * 1024


def job_line(run, jobs: dict) -> str:
    """'Slurm job 12: PENDING (Resources)' — what Slurm says of the run's job now, in one line."""
    info = slurm_info(run) or {}
    job_id = str(info.get("job_id"))
    job = jobs.get(job_id)
    if job is None:
        return f"Slurm job {job_id}: no longer in the queue"
    code = f", exit code {job.exit_code}" if job.ended and job.exit_code is not None else ""
    return f"Slurm job {job_id}: {job.state}{f' ({job.reason})' if job.reason else ''}{code}"


def show_job(run) -> None:
    """The run's Slurm job (nothing for a local run)."""
    if slurm_info(run) is None:
        return
    try:
        st.caption(job_line(run, queue()), help="From squeue, read at most every 10 s for every open tab.")
    except SlurmUnavailable as exc:
        st.caption(f"Slurm job {slurm_info(run).get('job_id')}: Slurm does not answer ({exc})")
    with st.expander("Slurm job script"):
        try:
            st.code((run_folder(state.engine(), run.id) / SCRIPT_FILE).read_text(), language="bash")
        except OSError as exc:
            st.caption(f"The script cannot be read: {exc.strerror or exc}")
    with st.expander("Job output (Slurm)"):
        text, _ = read_job_log(run, 0, max_bytes=LOG_TAIL_BYTES)
        st.code(text or "(nothing written yet: the job has not started)", language=None)


def with_pending_reasons(frame, engine):
    """The Runs table with a pending Slurm job's reason beside its run's status: 'queued · PENDING (Resources)'.
    From the shared poll (no squeue of its own within its interval); the frame as it is without Slurm runs."""
    from trainer_backend.control.slurm_status import watch_slurm_runs

    jobs = watch_slurm_runs(engine)
    if not jobs or frame.empty:
        return frame
    frame = frame.copy()
    frame["status"] = [
        f"{status} · {jobs[run].state}{f' ({jobs[run].reason})' if jobs[run].reason else ''}"
        if run in jobs and jobs[run].state == "PENDING" else status
        for run, status in zip(frame["run"], frame["status"])
    ]
    return frame


@st.cache_data(ttl=30, show_spinner=False)
def partitions_line() -> str:
    """The cluster's partitions with their free nodes and GPUs, or why Slurm is not offered here: one line,
    read from sinfo at most every 30 s whatever the number of tabs."""
    from trainer_backend.control.slurm_status import partitions

    found = partitions()
    if isinstance(found, str):
        return f"Slurm is not offered here: {found}."
    return "Slurm partitions: " + "; ".join(
        f"{p.name}{' (default)' if p.default else ''} {p.free_nodes} of {p.nodes} nodes free"
        + (f", {p.free_gpus} of {p.gpus} GPUs free" if p.gpus else "") for p in found)


def show_partitions(slot) -> None:
    """Below the Launch form's Slurm fields: where a job could go now."""
    slot.caption(partitions_line())

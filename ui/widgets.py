"""Small pieces the pages share: status badges, the run picker, progress bars, the log tail."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import streamlit as st

from db.folders import open_regular_file
from db.store import RunRecord, RunSummary

STATUS_COLORS = {
    "queued": "gray", "running": "blue", "completed": "green",
    "failed": "red", "cancelled": "orange", "lost": "violet", "pruned": "gray",
}
STATUS_ICONS = {
    "queued": ":material/schedule:", "running": ":material/autorenew:", "completed": ":material/check_circle:",
    "failed": ":material/error:", "cancelled": ":material/cancel:", "lost": ":material/help:",
    "pruned": ":material/content_cut:",
}
LOG_TAIL_LINES = 40
LOG_TAIL_BYTES = 64 * 1024


def status_badge(status: str) -> None:
    st.badge(status, icon=STATUS_ICONS.get(status), color=STATUS_COLORS.get(status, "gray"))


def summary_label(run: RunSummary) -> str:
    """'#12 · completed · ddp · test_resnet · digits' for pickers."""
    return f"#{run.id} · {run.status} · {run.strategy} · {run.model} · {run.dataset}"


def pick_run(runs: Sequence[RunSummary], wanted: int | None) -> int:
    """A selectbox of runs (newest first) set to ``wanted`` when it exists; returns the chosen id."""
    ids = [run.id for run in runs]
    labels = {run.id: summary_label(run) for run in runs}
    index = ids.index(wanted) if wanted in ids else 0
    return st.selectbox("Show run", ids, index=index, format_func=labels.__getitem__)


def progress_bars(run: RunRecord, epochs_done: int, epochs_total: int) -> None:
    """Epoch k of n, and the step within the epoch under way (from the run's progress columns)."""
    epochs_total = max(1, epochs_total)
    left, right = st.columns(2)
    left.progress(min(1.0, epochs_done / epochs_total), text=f"Epoch {epochs_done} of {epochs_total} done")
    step, total = run.progress_step or 0, run.progress_total_steps or 0
    if run.status == "completed":
        right.progress(1.0, text="All steps done")
    elif total:
        verb = "Step" if run.status in ("queued", "running") else "Stopped at step"
        right.progress(min(1.0, step / total), text=f"{verb} {step} of {total} in epoch {run.progress_epoch}")
    elif run.status == "queued":
        right.progress(0.0, text="Waiting for its devices")
    elif run.status == "running":
        right.progress(0.0, text="Loading the data and the model; waiting for the first step")


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str | None:
    """The last ``lines`` lines of a log file (reading at most its last 64 KiB); None if absent.
    Raises NotARegularFile for a named pipe, a device or a folder (``open_regular_file``)."""
    try:
        with open_regular_file(path) as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - LOG_TAIL_BYTES))
            # Bounded: a log that grows fast must not be read without end.
            text = handle.read(LOG_TAIL_BYTES).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None
    return "\n".join(text.splitlines()[-lines:])


def format_bytes(size: int) -> str:
    """A file's size in the unit that shows it: '812 B', '41.3 kB', '44.7 MB', '2.3 GB' (binary multiples)."""
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size} B"


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"

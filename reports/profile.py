"""Profiler exports: the op table as CSV, and one self-contained HTML report.

The report embeds plotly.js once, inline, so it opens offline from a file or an e-mail; the
CLI (``export RUN_ID --profile-dir DIR``) and the dashboard's download buttons share this code.
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from db import profiles, store
from contract.storage import DiskFullError, check_export_dir, write_export

from .report_html import REPORT_CSS, charts_html
from .profile_charts import breakdown_means, memory_by_op_figure, step_breakdown_figure, top_ops, top_ops_figure
from .spreadsheet import frame_for_csv

SUMMARY_FIELDS = ("strategy", "devices", "model", "dataset", "batch_size", "image_size", "amp",
                  "profile_wait", "profile_warmup", "profile_active")


def load_profile(engine, run_id: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ops, steps) of a run as DataFrames; LookupError when the run was not profiled."""
    ops = pd.DataFrame(profiles.read_ops(engine, run_id))
    steps = pd.DataFrame(profiles.read_steps(engine, [run_id]))
    if ops.empty and steps.empty:
        raise LookupError(f"run {run_id} has no profile: launch it with --profile (or 'Profile' on the Launch page)")
    return ops, steps


def ops_csv(ops: pd.DataFrame) -> bytes:
    return frame_for_csv(ops).to_csv(index=False).encode()


def report_html(engine, run_id: int) -> str:
    run = store.export_run(engine, run_id)
    ops, steps = load_profile(engine, run_id)
    ranks = sorted(ops["rank"].unique()) if not ops.empty else [0]
    figures = [step_breakdown_figure(steps)] if not steps.empty else []
    for rank in ranks:
        figures += [top_ops_figure(ops, rank=rank), memory_by_op_figure(ops, rank=rank)]
    summary = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(run['config'].get(k)))}</td></tr>" for k in SUMMARY_FIELDS
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in run["notes"])
    breakdown = breakdown_means(steps).round(2).to_html(index=False) if not steps.empty else ""
    table = top_ops(ops, rank=ranks[0], n=30).drop(columns=["self_total_us"]).round(1).to_html(index=False)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Parallax profile · run {run_id}</title>
<style>{REPORT_CSS}</style></head>
<body><h1>Profile of run {run_id}: {html.escape(run['strategy'])} · {html.escape(run['model'])} · {html.escape(run['dataset'])}</h1>
<p>Status {html.escape(run['status'])}. Times are summed over the profiled steps of the first epoch.</p>
<table>{summary}</table><ul>{notes}</ul>
<h2>Where a step's time goes</h2>{breakdown}
{charts_html(figures)}
<h2>Top ops (rank {ranks[0]})</h2>{table}
</body></html>"""


def trace_file_name(run_id: int, rank: int) -> str:
    """A rank's trace file, named by its run: traces of several runs kept in one folder stay apart."""
    return f"parallax-run-{run_id}-trace-rank{rank}.json.gz"


def write_profile_dir(engine, run_id: int, directory: Path) -> list[Path]:
    """Write parallax-run-<N>-trace-rank<R>.json.gz, ops.csv and report.html into ``directory``; returns the
    paths."""
    check_export_dir(directory, "--profile-dir")
    ops, _ = load_profile(engine, run_id)
    written = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for trace in profiles.list_traces(engine, run_id):
            path = directory / trace_file_name(run_id, trace["rank"])
            write_export(path, profiles.read_trace(engine, run_id, trace["rank"]), "profile trace")
            written.append(path)
        for name, data in (("ops.csv", ops_csv(ops)), ("report.html", report_html(engine, run_id).encode())):
            write_export(directory / name, data, "profile file")
            written.append(directory / name)
    except DiskFullError:
        raise
    except OSError as exc:  # a read-only folder, a full disk, a folder where a file should go
        raise ValueError(f"cannot write the profile into --profile-dir {directory}: {exc.strerror or exc}"
                         f"{f' ({exc.filename})' if exc.filename else ''}") from None
    return written

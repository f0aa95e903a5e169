"""Streamlit pieces for profiler output that more than one page shows: the "how to profile"
hint, a run's step-breakdown chart, and the trace download buttons."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from db import profiles

from reports.profile import trace_file_name
from reports.profile_charts import step_breakdown_figure

HOW_TO_PROFILE = ("Profile a run by switching on **Profile the first steps (torch.profiler)** on the Launch page, "
                  "or from a terminal: `parallax run --profile …`. The profiler records a few "
                  "steps of the first epoch; their op table, step breakdown and trace then show here.")


def step_breakdown_chart(engine, run_ids: list[int], key: str) -> bool:
    """The mean step breakdown of ``run_ids`` (one bar per run and rank); False when none was profiled."""
    steps = pd.DataFrame(profiles.read_steps(engine, run_ids))
    if steps.empty:
        return False
    st.plotly_chart(step_breakdown_figure(steps), key=key)
    return True


def trace_downloads(engine, run_id: int) -> None:
    """One button per rank's gzipped Chrome trace; the bytes are read on click, not on every rerun."""
    traces = profiles.list_traces(engine, run_id)
    if not traces:
        st.caption("No trace was stored for this run.")
        return
    columns = st.columns(min(4, len(traces)))
    for i, trace in enumerate(traces):
        rank = trace["rank"]
        columns[i % len(columns)].download_button(
            f"Trace of rank {rank} ({trace['gzip_bytes'] / 2**20:.1f} MB gzipped)",
            data=lambda rank=rank: profiles.read_trace(engine, run_id, rank),
            file_name=trace_file_name(run_id, rank), mime="application/gzip",
            on_click="ignore", icon=":material/download:", key=f"trace_{run_id}_{rank}",
        )
    st.caption("Each trace opens in [Perfetto](https://ui.perfetto.dev) or `chrome://tracing` "
               "(both read the .json.gz as it is): the timeline of every op, step and collective.")

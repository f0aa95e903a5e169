"""Profiler: where a profiled run's training steps spend their time. The step breakdown per rank
(optionally beside a second run's, e.g. DP against DDP), the heaviest ops by self CPU and device
time, memory by op, and downloads: each rank's Chrome trace, the op table (CSV), an HTML report.
``?run=N`` in the URL picks the run; runs are profiled with ``--profile`` or the Launch page's switch."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from db import profiles, store
from reports.profile import load_profile, ops_csv, report_html
from reports.profile_charts import memory_by_op_figure, step_breakdown_figure, top_ops, top_ops_figure
from ui import state, widgets
from ui.profile_views import HOW_TO_PROFILE, trace_downloads
from ui.text import escape_markdown

state.enter_through_app("pages/profiler.py")

NO_COMPARISON = 0  # the "compare with" picker's "nothing" entry (run ids start at 1)


def pick_profiled_run(profiled: list[int], labels: dict[int, str]) -> int:
    wanted = state.requested_run_id()
    if wanted is not None and wanted not in profiled:
        st.caption(f"Run #{wanted} was not profiled; showing the newest profiled run instead.")
    index = profiled.index(wanted) if wanted in profiled else 0
    return st.selectbox("Profiled run", profiled, index=index, format_func=labels.__getitem__, key="profiled_run")


def ops_display(ops: pd.DataFrame, rank: int, n: int) -> pd.DataFrame:
    frame = top_ops(ops, rank=rank, n=n)
    return pd.DataFrame({
        "op": frame["name"],
        "calls": frame["calls"],
        "self CPU (ms)": (frame["self_cpu_us"] / 1000).round(2),
        "self device (ms)": (frame["self_device_us"] / 1000).round(2),
        "CPU total (ms)": (frame["cpu_total_us"] / 1000).round(2),
        "memory (MB)": ((frame["self_cpu_memory_bytes"] + frame["self_device_memory_bytes"]) / 2**20).round(2),
    })


st.title("Profiler")
engine = state.engine_with_fresh_states()
summaries = {run.id: run for run in store.run_summaries(engine, profiles.profiled_runs(engine))}
profiled = sorted(summaries, reverse=True)
if not profiled:
    st.info("No profiled runs yet. " + HOW_TO_PROFILE, icon=":material/speed:")
    st.page_link(state.LAUNCH_PAGE, label="Launch a profiled run", icon=":material/rocket_launch:")
    st.stop()

asked = store.parse_id(st.query_params.get("run", ""))
existing = [*summaries, *(run.id for run in store.run_summaries(engine, [asked] if asked else []))]
if problem := state.unknown_url_id("run", existing):
    st.error(problem, icon=":material/error:")
    st.page_link(state.RUNS_PAGE, label="All runs", icon=":material/table_rows:")
    st.stop()

labels = {run_id: widgets.summary_label(summaries[run_id]) for run_id in profiled}
run_col, compare_col = st.columns(2)
with run_col:
    run_id = pick_profiled_run(profiled, labels)
with compare_col:
    other_id = st.selectbox(
        "Compare with", [NO_COMPARISON, *(i for i in profiled if i != run_id)], key="profile_compare",
        format_func=lambda i: "(no other run)" if i == NO_COMPARISON else labels[i],
        help="Another profiled run, drawn beside this one in the step breakdown: e.g. DP against DDP.")
if run_id != state.requested_run_id():
    st.query_params["run"] = run_id
    st.session_state[state.RUN_ID_KEY] = run_id

ops, steps = load_profile(engine, run_id)
run = summaries[run_id]
st.caption(f"**{run.strategy}** · **{escape_markdown(run.model)}** on {escape_markdown(run.dataset)} · {run.status}. "
           "Times are summed over the profiled steps of the first epoch.")
st.page_link(state.RUN_PAGE, label=f"Open run #{run_id}", icon=":material/monitoring:", query_params={"run": run_id})

st.subheader("Where a step's time goes")
compared = [run_id] + ([other_id] if other_id != NO_COMPARISON else [])
all_steps = pd.DataFrame(profiles.read_steps(engine, compared))
if all_steps.empty:
    st.caption("No step breakdown was recorded.")
else:
    st.plotly_chart(step_breakdown_figure(all_steps), key="breakdown")
    st.caption("Communication (the hatched bar) is drawn beside the stack: under DDP it overlaps the backward pass "
               "rather than adding to it.")

st.subheader("Heaviest ops")
if ops.empty:
    st.caption("No op table was recorded.")
else:
    ranks = sorted(int(r) for r in ops["rank"].unique())
    rank_col, n_col = st.columns(2)
    rank = rank_col.selectbox("Rank", ranks, key="profile_rank", format_func=lambda r: f"rank {r}")
    n = n_col.slider("Ops shown", min_value=5, max_value=50, value=15, step=5, key="profile_top_n")
    st.dataframe(ops_display(ops, rank, n), hide_index=True)
    left, right = st.columns(2)
    left.plotly_chart(top_ops_figure(ops, rank=rank, n=n), key="top_ops")
    right.plotly_chart(memory_by_op_figure(ops, rank=rank, n=n), key="memory_by_op")

st.subheader("Downloads")
trace_downloads(engine, run_id)
csv_col, report_col, _ = st.columns([1, 1, 2])
if not ops.empty:
    csv_col.download_button("Op table (CSV)", ops_csv(ops), file_name=f"parallax-run-{run_id}-ops.csv",
                            mime="text/csv", on_click="ignore", icon=":material/download:")
report_col.download_button(
    "HTML report", lambda: report_html(engine, run_id),  # plotly.js inline: built on click only
    file_name=f"parallax-run-{run_id}-profile.html", mime="text/html", on_click="ignore", icon=":material/download:",
)

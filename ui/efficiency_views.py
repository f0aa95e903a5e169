"""Streamlit pieces for where time and memory go, shared by the Run, Compare and Sweep pages:
MFU beside images/s, the per-rank times with stragglers named, and the memory breakdown per device.
A figure a run did not record is not drawn; one caption says why."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from reports import efficiency, memory_check


def mfu_metric(row, run_epochs: pd.DataFrame, measurements: dict) -> str | None:
    """MFU (and achieved TFLOP/s) as a metric in ``row``, as wide as its text; or, where there is none,
    the line saying why (for the page's notes)."""
    figures = efficiency.mfu_by_run(run_epochs)
    if figures.empty or figures["mfu"].isna().all():
        return efficiency.mfu_missing(measurements, run_epochs)
    peak = measurements.get("peak_tflops")
    source = measurements.get("peak_source")
    measured = figures.iloc[0]
    # The denominator in the label: runs at the same TFLOP/s differ in MFU where their peaks differ.
    label = f"MFU (of {peak:.3g} TFLOP/s peak)" if peak else "MFU"
    row.metric(label, f"{measured.mfu:.1%}", width="content",
               help="Model FLOPs utilisation: the FLOPs a training step needs (counted once per run) times "
               "images/s, over the peak of the run's devices together"
               + (f" ({peak:g} TFLOP/s, {source})" if peak and source else "")
               + (f"; achieved {measured.achieved_tflops:.3f} TFLOP/s" if pd.notna(measured.achieved_tflops) else "")
               + ". Mean over the epochs after the first. " + efficiency.MFU_PEAK_NOTE)
    return None


def rank_times(run_epochs: pd.DataFrame, key: str) -> None:
    """The per-rank table and chart, stragglers named; one caption when the run recorded none."""
    ranks = efficiency.ranks_frame(run_epochs)
    if ranks.empty:
        if reason := efficiency.ranks_missing(run_epochs):
            st.caption(reason)
        return
    st.subheader("Time per rank")
    slow = efficiency.stragglers(ranks, efficiency.recorded_stragglers(run_epochs))
    if slow:
        st.warning(f"Straggler{'s' if len(slow) > 1 else ''}: rank {', '.join(map(str, slow))} — at least "
                   f"{efficiency.STRAGGLER_SLOWER:.0%} slower than the median rank for "
                   f"{efficiency.STRAGGLER_EPOCHS} epochs running; the other ranks wait for it in every collective.",
                   icon=":material/hourglass_bottom:")
    # The table under the chart, not beside it: beside it, its six columns were cut at 1,400 px.
    st.plotly_chart(efficiency.rank_times_figure(ranks), key=key)
    st.dataframe(efficiency.rank_table(ranks), hide_index=True, width="content")


def memory_breakdown(epochs: pd.DataFrame, labels: dict[int, str], key: str) -> None:
    """Memory per device stacked by what holds it, one bar per run and device; a line for runs without it."""
    frame = efficiency.breakdown_frame(epochs[epochs["run_id"].isin(list(labels))], labels)
    if not frame.empty:
        st.plotly_chart(efficiency.breakdown_figure(frame), key=key)
    if reason := efficiency.breakdown_missing(frame, list(labels), labels):
        st.caption(reason)


def estimate_check(runs: list[dict], epochs: pd.DataFrame, labels: dict[int, str], key: str) -> None:
    """Each run's memory estimate against what it measured, per device; a line for runs without one."""
    frame = memory_check.estimate_check_frame(runs, epochs, labels)
    if not frame.empty:
        st.markdown("**Memory: estimated before launch against measured**")
        st.dataframe(memory_check.estimate_check_display(frame), hide_index=True, key=key)
        st.caption("On GPUs the estimated peak against the allocator's peak (max_memory_allocated); on CPU, which "
                   "keeps no peak of live tensors, the parameters, gradients and optimizer state the run measured "
                   "exactly after its first step. Error: estimated / measured - 1.")
    if reason := memory_check.estimate_missing(runs, frame, labels):
        st.caption(reason)

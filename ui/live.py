"""How often the live pages (Run, Sweep) redraw what changed while a run trains.

A page's progress is a fragment with a timer (``REFRESH_S``); its per-epoch charts and tables are
drawn by the whole page, which a tick reruns when what they show changed (``redraw_due``); the
Run page's step and system charts are a fragment of their own (``series_refresh_s``).

    if live.redraw_due(status_changed, epochs_changed, drawn_at):
        st.rerun()
"""

from __future__ import annotations

import time

# Each rerun costs the Streamlit server tens of ms of CPU of its own, whatever the fragment draws (a
# one-progress-bar fragment every 2 s kept 0.027 of a core busy on 2 shared cores; a tick of the Run
# page's progress 0.10-0.13 s). With ticks every 5 s and redraws every 20 s one watching tab cost the
# server 0.074 of a core and the run 6 % of its images/s (docs/BENCHMARKS.md, watch cost): every 10 s.
REFRESH_S = 10
# The step and system charts: samples come every second, but resending and redrawing half a dozen
# charts of hundreds of points costs the server and the browser far more than a progress bar. Other
# trackers chart every 10-30 s.
SERIES_REFRESH_S = 10
# A new epoch redraws the whole page (a dozen charts, in the server and the browser) at most this
# often: epochs of a few seconds (a small dataset) would otherwise redraw all of it at every tick.
# With epochs of 3 s, redrawing at every 5 s tick cost the server 0.08 of a core and the browser
# 0.26, and slowed the run watched by 12 %; every 15 s, 0.04 and 0.16, and 5 %; a redraw costs the
# server 0.33-0.45 s, so every 30 s. Epochs of real datasets last minutes, so each is still drawn as it lands.
EPOCH_REDRAW_S = 30


# A run just launched is watched for the moment it leaves the queue: on an idle machine its supervisor claims it
# within a second. Its page ticks this often while it is queued, for at most QUEUED_FAST_FOR_S after it was
# created (a run that waits for busy devices then ticks every REFRESH_S, as any other).
QUEUED_REFRESH_S = 1
QUEUED_FAST_FOR_S = 30


def progress_refresh_s(status: str, age_s: float) -> float | None:
    """The progress fragment's timer for a run in ``status``, created ``age_s`` ago: none once it has ended."""
    if status not in ("queued", "running"):
        return None
    return QUEUED_REFRESH_S if status == "queued" and age_s < QUEUED_FAST_FOR_S else REFRESH_S


def redraw_due(state_changed: bool, epochs_changed: bool, drawn_at: float) -> bool:
    """Whether the page drawn at ``drawn_at`` (``time.monotonic()``) must run again: at once for a
    new status or note, and for new epochs once ``EPOCH_REDRAW_S`` have passed."""
    return state_changed or (epochs_changed and time.monotonic() - drawn_at >= EPOCH_REDRAW_S)


def series_refresh_s(active: bool, last_epoch_s: float | None) -> float | None:
    """The step and system charts' own timer: none once the run has ended, nor while its epochs
    last less than ``EPOCH_REDRAW_S`` (the page's redraws for them come as often as the timer
    would, and draw these charts too: a timer of their own would draw them twice)."""
    if not active or (last_epoch_s is not None and last_epoch_s < EPOCH_REDRAW_S):
        return None
    return SERIES_REFRESH_S

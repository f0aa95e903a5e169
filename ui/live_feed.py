"""The Run page's live step charts: loss and images/s per step, growing in the browser as the run records them.

A Streamlit rerun costs the server about 0.1 s of CPU whatever it draws (ui/live.py), so a chart redrawn by
reruns every second would cost a watching tab a tenth of a core. Instead the page embeds, once, a small
document (``feed_html``) that asks the server's ``/_parallax/live/<run>`` route (ui/serving.py) every
``POLL_S`` for the points after the last one it has, and draws them with plotly.js (served once, cached by
the browser): a poll is two index seeks and a few hundred bytes, about a millisecond of the server's CPU.

    html = feed_html(run_id)                   # embedded with st.components.v1.html while the run is active
    payload = feed(engine, run_id, after=120)  # what the route answers: status, progress, new points

The route's link is signed like a download's (ui/downloads.py): only a page that passed the access checks
makes one. Polling stops when the run has ended (the page then draws its final charts) and pauses while the
tab is hidden.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import time
from pathlib import Path

from ui import downloads

ROUTE = "/_parallax/live"
PLOTLY_ROUTE = "/_parallax/plotly.min.js"
POLL_S = 1.0
# Links change only every LINK_WINDOW_S, so that the embedded document (which holds the link) stays the same
# across the page's reruns and the browser keeps it, with its charts, instead of loading it again.
LINK_WINDOW_S = 6 * 3600
# Points one answer carries, and what the browser keeps before it asks for the whole run again, downsampled:
# a live chart is half a screen wide (pages/run.py's LIVE_MAX_POINTS).
MAX_POINTS = 600
FEED_HEIGHT_PX = 360
TERMINAL = ("completed", "failed", "cancelled", "lost", "pruned")


def _signature(run_id: int, expires: int) -> str:
    return hmac.new(downloads.LINK_SECRET, f"live/{run_id}/{expires}".encode(), hashlib.sha256).hexdigest()


def link(run_id: int, *, prefix: str | None = None, now: float | None = None, route: str = ROUTE) -> str:
    """The URL path of run ``run_id``'s feed (at ``route``: a script run's is ui/script_feed.py's), good for
    LINK_WINDOW_S to 2 * LINK_WINDOW_S from now."""
    now = time.time() if now is None else now
    expires = (int(now // LINK_WINDOW_S) + 2) * LINK_WINDOW_S
    prefix = downloads.base_path() if prefix is None else prefix
    return f"{prefix.rstrip('/')}{route}/{int(run_id)}?expires={expires}&sig={_signature(int(run_id), expires)}"


def link_problem(run_id: int, expires: str | None, sig: str | None, *, now: float | None = None) -> str | None:
    """Why a feed link is refused (plain text), or None when it is good."""
    if not expires or not expires.isdigit() or not sig or len(sig) != 64:
        return "This live-chart link is malformed."
    if not hmac.compare_digest(_signature(run_id, int(expires)), sig):
        return "This live-chart link was not made by this dashboard (or it has restarted since): reload the page."
    if int(expires) <= (time.time() if now is None else now):
        return "This live-chart link has expired: reload the page."
    return None


def parse_after(text: str | None) -> int | None:
    """The ``after`` query value: a step number from 0 up (0 asks for the whole run, downsampled)."""
    if text is None or not text.isdigit() or len(text) > 12:
        return None
    return int(text)


def feed(engine, run_id: int, after: int) -> dict | None:
    """The run's status and progress, and its step points after step ``after`` as columns (``step``, ``epoch``,
    ``t_s``, ``train_loss``, ``images_per_s``, ``n``: steps a point stands for). ``after`` 0: the whole run, at
    most MAX_POINTS (each bucket's last point, ``db.series.read_steps``), with ``whole`` true. None for no such run."""
    from db import series

    state = series.live_state(engine, run_id)
    if state is None:
        return None
    if after == 0:
        rows = series.read_steps(engine, [run_id], max_points=MAX_POINTS) if state["last_step"] else []
    elif state["last_step"] > after:
        rows = [{**row, "n": 1} for row in series.read_steps_after(engine, run_id, after, limit=MAX_POINTS)]
    else:
        rows = []
    columns = ("step", "epoch", "t_s", "train_loss", "images_per_s", "n")
    return {**state, "whole": after == 0, "points": {name: [row[name] for row in rows] for name in columns}}


@functools.cache
def plotly_js() -> bytes:
    """plotly.js as the installed plotly package ships it (the version the dashboard's figures are made for)."""
    import plotly

    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()


@functools.cache
def chart_layouts() -> dict[str, dict]:
    """Each live chart's layout, as the Run page's other step charts lay theirs out (the same for every run)."""
    from reports import series_charts

    empty = series_charts.steps_frame([])
    return {column: json.loads(series_charts.step_figure(empty, column).to_json())["layout"]
            for column in series_charts.STEP_TITLES}


def feed_html(run_id: int, *, log_loss: bool = False) -> str:
    """The embedded document: a line saying how far the run is, and the two charts, drawn from the first
    recorded point on (until then no chart frame is shown); the loss on a log axis where ``log_loss``."""
    layouts = chart_layouts()
    if log_loss:
        layouts = {**layouts, "train_loss": {**layouts["train_loss"],
                                             "yaxis": {**layouts["train_loss"].get("yaxis", {}), "type": "log",
                                                       "autorange": True, "range": None, "rangemode": "normal"}}}
    settings = {"feed": link(run_id), "plotly": f"{downloads.base_path()}{PLOTLY_ROUTE}", "poll_ms": int(POLL_S * 1000),
                "max_points": MAX_POINTS, "layouts": layouts, "terminal": list(TERMINAL)}
    # "</" cannot end the script early: every "<" in the settings is written as \u003c.
    return with_settings(_PAGE, settings)


# What both live documents (this one and ui/script_feed.py's) do the same: plotly.js loaded once, from the
# dashboard's own route (S.plotly), when the first chart is drawn.
LOAD_PLOTLY_JS = """function loadPlotly() {
  if (plotly) return plotly;
  plotly = new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = S.plotly;
    script.onload = () => resolve(window.Plotly);
    script.onerror = reject;
    document.head.appendChild(script);
  });
  return plotly;
}
"""


def with_settings(page: str, settings: dict) -> str:
    """A live document with its settings: JSON in its script, no "<" that could end the script early."""
    return page.replace("SETTINGS", json.dumps(settings).replace("<", "\\u003c"))


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8">
<style>
  body { margin: 0; font-family: "Source Sans Pro", sans-serif; color: rgb(49, 51, 63); }
  #state { font-size: 14px; height: 22px; }
  #charts { display: flex; gap: 16px; }
  #charts > div { flex: 1 1 0; min-width: 0; }
</style></head>
<body>
<div id="state"></div>
<div id="charts"><div id="train_loss" class="live-chart"></div><div id="images_per_s" class="live-chart"></div></div>
<script>
const S = SETTINGS;
const points = {step: [], epoch: [], t_s: [], train_loss: [], images_per_s: [], n: []};
let after = 0, timer = null, plotly = null, busy = false, ended = false;

LOAD_PLOTLY

// Only what the page around it does not say: the page's badge and progress bars say whether the run is queued or
// loading, redrawn together; a second voice polling apart from them would say "running" beside a "queued" badge.
function stateText(d) {
  if (S.terminal.includes(d.status)) return "The run has ended (" + d.status + "): its final charts follow.";
  if (d.status !== "running" || !points.step.length) return "";
  return "Live: step " + d.step + " of " + d.total_steps + " in epoch " + d.epoch;
}

async function draw() {
  if (!points.step.length) return;
  const Plotly = await loadPlotly();
  const few = points.step.length < 30;
  for (const column of ["train_loss", "images_per_s"]) {
    const trace = {x: points.step, y: points[column], type: "scatter", mode: few ? "lines+markers" : "lines",
                   name: column, showlegend: false, customdata: points.epoch.map((e, i) => [e, points.t_s[i]]),
                   hovertemplate: "step %{x}<br>epoch %{customdata[0]}, %{customdata[1]:.0f} s<br>%{y:.4g}"};
    Plotly.react(column, [trace], S.layouts[column], {displaylogo: false, responsive: true});
  }
}

let covered = 0;  // every step recorded up to here is in ``points`` (as itself or in a bucket's mean)

function take(d) {
  if (d.whole) for (const name in points) points[name] = [];
  for (const name in points) points[name].push(...d.points[name]);
  // A whole run comes as each bucket's last point: carry on after the run's last step.
  if (d.whole) covered = d.last_step;
  else if (points.step.length) covered = points.step[points.step.length - 1];
  // Past twice a chart's points: ask for the whole run again, downsampled by the server.
  after = points.step.length > 2 * S.max_points ? 0 : covered;
  return d.points.step.length > 0 || d.whole;
}

async function poll() {
  timer = null;
  if (busy || ended) return;
  busy = true;
  if (document.visibilityState !== "hidden") {
    try {
      const answer = await fetch(S.feed + "&after=" + after, {cache: "no-store", credentials: "same-origin"});
      if (answer.ok) {
        const d = await answer.json();
        const fresh = take(d);
        document.getElementById("state").textContent = stateText(d);
        if (fresh) await draw();
        window.drawnUpTo = covered;  // every step recorded up to here is on the charts (for tests, benchmarks)
        ended = S.terminal.includes(d.status);  // ended: the page draws its final charts
      }
    } catch (e) { /* the server restarting: try again at the next poll */ }
  }
  busy = false;
  if (!ended) timer = setTimeout(poll, S.poll_ms);
}

loadPlotly();  // now, while the run starts: its first point is then drawn as soon as it comes
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible" && !busy && !ended) { clearTimeout(timer); poll(); }
});
poll();
</script>
</body></html>
""".replace("LOAD_PLOTLY\n", LOAD_PLOTLY_JS)

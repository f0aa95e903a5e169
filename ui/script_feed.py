"""A running script run's logged metrics, growing in the browser as the script logs them.

A Streamlit rerun costs the server tens of ms of CPU whatever it draws, and re-reading every shown series
costs more as the run grows; so, as the launched runs' live step charts do (ui/live_feed.py), the Run page
embeds once a small document (``feed_html``) that asks the server's ``/_parallax/script-live/<run>`` route
(ui/serving.py) every ``POLL_S`` for the values of its charts' names after the last step each holds
(``db.script_metrics.read_points_after``: index seeks and the new chunks alone), and appends them with
plotly.js. Its first ask, and every ``REDRAW_AFTER_POINTS`` appended values, takes each series whole as
buckets of minimum, maximum and last value (``read_points``), drawn as a band and a line as the page draws
them; the values appended in between are drawn raw, a line of their own, until that redraw.

    html = feed_html(run_id, {"train": ["train/loss"], "val": ["val/acc"]})  # embedded while the run is active
    payload = feed(engine, run_id, {"train/loss": 120, "val/acc": 100})  # new values; feed(engine, run_id, names)
                                                                        # with after=None: the series whole

The route's link is signed as the launched runs' is (``live_feed.link``). Polling stops when the run has
ended (the page then draws its final charts) and pauses while the tab is hidden.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence

from ui import downloads, live_feed

ROUTE = "/_parallax/script-live"
POLL_S = live_feed.POLL_S
MAX_NAMES = 12  # the charts a script run's page draws at once (ui/script_views.py's MAX_CHARTS)
# Values of one name one answer carries: a script logging a thousand a second is caught up at each poll.
MAX_NEW_POINTS = 5000
# Buckets per series in a whole answer: about two per pixel column of a chart half a screen wide.
MAX_BUCKETS = 1000
# Raw values a chart appends before the series is asked for whole again, reduced to buckets: a chart of
# tens of thousands of raw points would cost the browser at every append.
REDRAW_AFTER_POINTS = 20_000
GROUP_TITLE_PX, CHART_GAP_PX = 28, 8


def parse_request(names: Sequence[str], afters: Sequence[str]) -> tuple[list[str], dict[str, int] | None] | str:
    """The route's ``name`` and ``after`` values: the names and {name: step} (None: each series whole, for no
    ``after``), or why they are refused (plain text)."""
    if not names or len(names) > MAX_NAMES:
        return f"name must be given 1 to {MAX_NAMES} times; got {len(names)}."
    if not afters:
        return list(names), None
    if len(afters) != len(names):
        return f"after must be given once for each name ({len(names)}); got {len(afters)}."
    steps = {}
    for name, text in zip(names, afters):
        if text != "-1" and (not text.isdigit() or len(text) > 12):
            return f"after must be a step number from -1 up; got {text[:20]!r}."
        steps[name] = int(text)
    return list(names), steps


def feed(engine, run_id: int, names: Sequence[str], after: Mapping[str, int] | None = None) -> dict | None:
    """The run's status and, for each of ``names`` it logged: its values after ``after[name]`` as columns (``step``,
    ``t_s``, ``value``, ``more``), or with ``after`` None the series whole as buckets (``step``, ``value``,
    ``min``, ``max``, ``n``, ``nonfinite``), with ``whole`` true. None for no such run."""
    from db import script_metrics

    status = script_metrics.run_status(engine, run_id)
    if status is None:
        return None
    if after is not None:
        return {"status": status, "whole": False,
                "names": script_metrics.read_points_after(engine, run_id, after, limit=MAX_NEW_POINTS)}
    columns: dict[str, dict[str, list]] = {}
    for row in script_metrics.read_points(engine, [run_id], names=list(names), max_points=MAX_BUCKETS):
        column = columns.setdefault(row["name"], {key: [] for key in ("step", "value", "min", "max", "n", "nonfinite")})
        defaults = {"min": row["value"], "max": row["value"], "n": 1, "nonfinite": 0}  # a value of its own
        for key in column:
            column[key].append(row[key] if row.get(key) is not None else defaults.get(key))
    return {"status": status, "whole": True, "names": columns}


def height_px(groups: Mapping[str, Sequence[str]]) -> int:
    """The document's height: each group's title and its charts, two a row."""
    from reports.charts import CHART_HEIGHT_PX

    return sum(GROUP_TITLE_PX + -(-len(group) // 2) * (CHART_HEIGHT_PX + CHART_GAP_PX) for group in groups.values())


@functools.cache
def _layout(name: str, log: bool) -> dict:
    """A metric chart's layout, as the page lays out its own (ui/script_views.py's ``metric_figure``)."""
    from contract.printable import plotly_text
    from reports.charts import base_figure, on_log_scale

    figure = base_figure(plotly_text(name), "step", "")
    figure.update_layout(showlegend=False)
    return json.loads(on_log_scale(figure, log).to_json())["layout"]


def feed_html(run_id: int, groups: Mapping[str, Sequence[str]], *, log_loss: bool = False) -> str:
    """The embedded document: the charts of ``groups`` ({prefix: names}, in the page's order), two a row, each
    drawn from its first ask; the losses on a log axis where ``log_loss``."""
    from plotly.colors import DEFAULT_PLOTLY_COLORS

    from reports.charts import is_loss
    from reports.series_charts import BAND_ALPHA, with_alpha

    colour = DEFAULT_PLOTLY_COLORS[0]
    settings = {
        "feed": live_feed.link(run_id, route=ROUTE), "plotly": f"{downloads.base_path()}{live_feed.PLOTLY_ROUTE}",
        "poll_ms": int(POLL_S * 1000), "redraw_after": REDRAW_AFTER_POINTS, "terminal": list(live_feed.TERMINAL),
        "groups": {prefix: list(names) for prefix, names in groups.items()},
        "layouts": {name: _layout(name, log_loss and is_loss(name)) for names in groups.values() for name in names},
        "colour": colour, "band": with_alpha(colour, BAND_ALPHA),
    }
    # "</" cannot end the script early: every "<" in the settings is written as \\u003c.
    return live_feed.with_settings(_PAGE, settings)


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8">
<style>
  body { margin: 0; font-family: "Source Sans Pro", sans-serif; color: rgb(49, 51, 63); }
  .group { font-weight: 600; font-size: 16px; height: GROUPpx; line-height: GROUPpx; }
  .row { display: flex; gap: 16px; margin-bottom: GAPpx; }
  .row > div { flex: 1 1 0; min-width: 0; }
</style></head>
<body>
<div id="charts"></div>
<script>
const S = SETTINGS;
const names = [];
const held = {};  // name -> {after: every step up to here is drawn, raw: values appended since the last whole draw}
let whole = true, timer = null, plotly = null, busy = false, ended = false;
window.bornAt = Date.now();  // the document's own start: the same while it grows (for tests)
window.wholeDraws = 0;

(function layout() {
  const charts = document.getElementById("charts");
  for (const [prefix, group] of Object.entries(S.groups)) {
    const title = document.createElement("div");
    title.className = "group";
    title.textContent = prefix;
    charts.appendChild(title);
    for (let i = 0; i < group.length; i += 2) {
      const row = document.createElement("div");
      row.className = "row";
      for (const name of group.slice(i, i + 2)) {
        const chart = document.createElement("div");
        chart.className = "live-chart";
        chart.dataset.name = name;
        chart.id = "chart-" + names.length;
        names.push(name);
        row.appendChild(chart);
      }
      if (row.children.length < 2) row.appendChild(document.createElement("div"));
      charts.appendChild(row);
    }
  }
})();

LOAD_PLOTLY

function escapeText(text) {
  return text.replace(/&/g, "&amp;").replace(/[<]/g, "&lt;").replace(/[>]/g, "&gt;");
}

// The series whole, as buckets: a band from each bucket's minimum to its maximum, a line through each bucket's last
// value, a red cross where a bucket holds a NaN or an infinity (as the page draws it: reports/series_charts.py);
// then a line of its own for the raw values appended until the next whole draw.
function drawWhole(Plotly, chart, name, c) {
  const line = c.step.map((s, i) => i).filter(i => c.value[i] !== null);
  const bad = c.step.map((s, i) => i).filter(i => c.nonfinite[i] > 0);
  const band = {mode: "lines", line: {width: 0, color: S.colour}, hoverinfo: "skip", showlegend: false,
                connectgaps: false};
  const bucketed = Math.max(1, ...c.n);
  const last = line.length ? line[line.length - 1] : null;
  const traces = [
    {...band, x: c.step, y: c.max, name: name + " max"},
    {...band, x: c.step, y: c.min, name: name + " min", fill: "tonexty", fillcolor: S.band},
    {x: line.map(i => c.step[i]), y: line.map(i => c.value[i]), name: name, showlegend: false,
     mode: line.length < 30 ? "lines+markers" : "lines", line: {color: S.colour},
     customdata: line.map(i => [c.min[i], c.max[i], c.n[i]]),
     hovertemplate: "%{y:.4g}<br>min %{customdata[0]:.4g}, max %{customdata[1]:.4g} of %{customdata[2]:,} values<extra><\\/extra>"},
    {x: last === null ? [] : [c.step[last]], y: last === null ? [] : [c.value[last]], name: name + " new",
     showlegend: false, mode: "lines", line: {color: S.colour}, hovertemplate: "%{y:.4g}<extra><\\/extra>"},
    {x: bad.map(i => c.step[i]), y: bad.map(i => c.max[i] ?? c.value[i] ?? c.min[i] ?? 0), mode: "markers",
     name: name + ": NaN or infinite", showlegend: false, marker: {symbol: "x", color: "crimson", size: 8},
     customdata: bad.map(i => c.nonfinite[i]), hovertemplate: "%{customdata:,} NaN or infinite value(s)<extra><\\/extra>"},
  ];
  const layout = JSON.parse(JSON.stringify(S.layouts[name]));
  if (bucketed > 1) {
    layout.title = {...layout.title, text: escapeText(name) + "<br><sup>line: the last value of every " +
      bucketed.toLocaleString("en") + " steps or fewer; band: their minimum to maximum<\\/sup>"};
    layout.margin = {...layout.margin, t: 60};
  }
  Plotly.react(chart, traces, layout, {displaylogo: false, responsive: true});
  held[name] = {after: c.step.length ? c.step[c.step.length - 1] : -1, raw: 0};
}

// New values, raw: appended to the line of new values (a NaN or an infinity as a cross at 0), never redrawn.
function append(Plotly, chart, name, c) {
  if (!c.step.length) return false;
  const good = c.step.map((s, i) => i).filter(i => c.value[i] !== null);
  const bad = c.step.map((s, i) => i).filter(i => c.value[i] === null);
  Plotly.extendTraces(chart, {x: [good.map(i => c.step[i]), bad.map(i => c.step[i])],
                              y: [good.map(i => c.value[i]), bad.map(() => 0)]}, [3, 4]);
  held[name].after = c.step[c.step.length - 1];
  held[name].raw += c.step.length;
  return held[name].raw > S.redraw_after;
}

async function poll() {
  timer = null;
  if (busy || ended) return;
  busy = true;
  let again = false;
  if (document.visibilityState !== "hidden") {
    try {
      let query = "";
      for (const name of names) {
        query += "&name=" + encodeURIComponent(name);
        if (!whole) query += "&after=" + (held[name] ? held[name].after : -1);
      }
      const answer = await fetch(S.feed + query, {cache: "no-store", credentials: "same-origin"});
      if (answer.ok) {
        const d = await answer.json();
        const Plotly = await loadPlotly();
        let redraw = false;
        names.forEach((name, index) => {
          const chart = document.getElementById("chart-" + index), c = d.names[name];
          if (!c) return;  // nothing logged under it yet
          if (d.whole || !held[name]) drawWhole(Plotly, chart, name, d.whole ? c : {...c, min: c.value, max: c.value,
                                                  n: c.step.map(() => 1), nonfinite: c.value.map(v => v === null ? 1 : 0)});
          else redraw = append(Plotly, chart, name, c) || redraw;
          again = again || !!c.more;
        });
        if (d.whole) window.wholeDraws += 1;
        whole = redraw;
        // Every value logged up to here is on the charts (for tests and benchmarks).
        window.drawnUpTo = Math.max(0, ...Object.values(held).map(h => h.after));
        ended = S.terminal.includes(d.status);  // ended: the page draws its final charts
      }
    } catch (e) { /* the server restarting: try again at the next poll */ }
  }
  busy = false;
  if (!ended) timer = setTimeout(poll, again ? 0 : S.poll_ms);
}

loadPlotly();
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible" && !busy && !ended) { clearTimeout(timer); poll(); }
});
poll();
</script>
</body></html>
""".replace("LOAD_PLOTLY\n", live_feed.LOAD_PLOTLY_JS).replace("GROUPpx", f"{GROUP_TITLE_PX}px").replace("GAPpx", f"{CHART_GAP_PX}px")

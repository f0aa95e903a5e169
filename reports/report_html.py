"""The look of the offline HTML reports: the dashboard's colours, axes that make room for their
labels, and tables that wrap rather than run off the page.

A figure carries whatever Plotly template is the default where it is built. In the dashboard's
process that is Streamlit's, whose colours are placeholders (#000001, #000002, ...) that only the
dashboard's browser code replaces, and whose axes leave the labels no room: a report written there
would draw its bars near-black and clip "1.5" to ".5". So every report figure is drawn with the
template below, whichever process writes it.

    charts_html([figure, ...])  # the figures' HTML, plotly.js inline once (opens offline)
"""

from __future__ import annotations

import copy

import plotly.graph_objects as go
import plotly.io as pio

# Streamlit's light theme, chartCategoricalColors (blue80, blue40, red80, red40, blueGreen80, green40,
# orange80, orange50, purple80, gray40): the colours the dashboard draws the same charts in.
DASHBOARD_COLORS = ("#0068c9", "#83c9ff", "#ff2b2b", "#ffabab", "#29b09d", "#7defa1", "#ff8700", "#ffd16a",
                    "#6d3fc0", "#d5dae5")
TEXT_COLOR = "#31333f"  # Streamlit's body text

# Tables as wide as the page at most: headers wrap between words, and a word longer than its column breaks.
REPORT_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2rem;max-width:1200px;color:#31333f}"
    "table{border-collapse:collapse;font-size:13px;max-width:100%}"
    "td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;overflow-wrap:break-word}"
    "th{background:#f0f2f6}h2{margin-top:2rem}"
)


def report_template() -> go.layout.Template:
    """Plotly's white template with the dashboard's colours; its axes grow their margins to fit
    their tick labels and titles (``automargin``)."""
    template = copy.deepcopy(pio.templates["plotly_white"])
    template.layout.colorway = DASHBOARD_COLORS
    template.layout.font.color = TEXT_COLOR
    template.layout.xaxis.automargin = True
    template.layout.yaxis.automargin = True
    return template


def charts_html(figures: list[go.Figure]) -> str:
    """The figures as HTML fragments in the report's template (copies: the callers' figures are the
    dashboard's too), plotly.js inline in the first only."""
    template = report_template()
    parts = []
    for i, figure in enumerate(figures):
        drawn = go.Figure(figure)
        drawn.update_layout(template=template)
        parts.append(drawn.to_html(full_html=False, include_plotlyjs="inline" if i == 0 else False,
                                   default_width="100%"))
    return "".join(parts)

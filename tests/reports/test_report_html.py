"""The offline reports' figures: drawn in the dashboard's colours with room for their labels, also
where Streamlit's template (placeholder colours the dashboard's browser code replaces) is the default."""

from __future__ import annotations

import json
import re

import plotly.graph_objects as go
import plotly.io as pio

from reports.report_html import DASHBOARD_COLORS, charts_html


def figure_json(fragment: str) -> dict:
    """The figure a ``charts_html`` fragment draws (Plotly.newPlot's data and layout)."""
    data, layout = re.search(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*(\[.*?\]),\s*(\{.*?\}),\s*\{", fragment, re.S).groups()
    return {"data": json.loads(data), "layout": json.loads(layout)}


def test_a_report_written_by_the_dashboards_process_keeps_the_dashboards_colours(monkeypatch):
    from streamlit.elements.lib.streamlit_plotly_theme import configure_streamlit_plotly_theme

    monkeypatch.setattr(pio.templates, "default", pio.templates.default)  # put back afterwards
    configure_streamlit_plotly_theme()  # what the dashboard's process does on importing st.plotly_chart
    assert pio.templates.default == "streamlit"
    figure = go.Figure(go.Bar(x=["single", "ddp"], y=[1.0, 1.5]))
    layout = figure_json(charts_html([figure]))["layout"]
    assert tuple(layout["template"]["layout"]["colorway"]) == DASHBOARD_COLORS
    assert layout["template"]["layout"]["yaxis"]["automargin"] is True
    assert layout["template"]["layout"]["xaxis"]["automargin"] is True
    assert figure.layout.template.layout.colorway[0] == "#000001"  # the dashboard's own figure is left as it was

"""Per-class accuracy and the confusion matrix of a run's best epoch, from ``runs.measurements["confusion"]``.

Pure functions: record in, DataFrame or Plotly figure out. A heatmap stays readable up to a few
dozen classes; past ``MAX_DRAWN_CLASSES`` the figure shows the classes with the most validation
images and says how many it left out.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from contract.printable import plotly_text

MAX_DRAWN_CLASSES = 30


def per_class_frame(record: dict) -> pd.DataFrame:
    """One row per class: its accuracy (None where validation had none of it) and its image count."""
    names = record["class_names"]
    support = record.get("support") or [sum(row) for row in record.get("matrix") or []] or [None] * len(names)
    return pd.DataFrame({"class": names, "accuracy": record["per_class_acc"], "validation images": support})


def confusion_figure(record: dict, max_classes: int = MAX_DRAWN_CLASSES) -> tuple[go.Figure | None, str]:
    """The heatmap (rows true class, columns prediction, each row as shares of its images) and a
    caption; no figure where the record holds no matrix."""
    matrix, names = record.get("matrix"), record["class_names"]
    if not matrix:
        return None, record.get("matrix_omitted", "No confusion matrix was recorded for this run.")
    shown = list(range(len(names)))
    caption = f"Epoch {record['epoch']} (the best): rows are the true class, columns the prediction."
    if len(names) > max_classes:
        shown = sorted(sorted(shown, key=lambda c: -sum(matrix[c]))[:max_classes])
        caption += (f" {len(names)} classes: the {max_classes} with the most validation images are drawn, "
                    f"{len(names) - max_classes} left out (their accuracy is in the table).")
    counts = [[matrix[r][c] for c in shown] for r in shown]
    shares = [[value / max(1, sum(matrix[r])) for value in row] for r, row in zip(shown, counts)]
    labels = [plotly_text(names[c]) for c in shown]  # class names are folder names: any text at all
    figure = go.Figure(go.Heatmap(
        z=shares, x=labels, y=labels, customdata=counts, colorscale="Blues", zmin=0, zmax=1,
        hovertemplate="true %{y}, predicted %{x}: %{customdata} images (%{z:.0%} of the row)<extra></extra>",
        colorbar={"title": "share of row", "tickformat": ".0%"},
    ))
    figure.update_layout(title="Confusion matrix", xaxis_title="predicted", yaxis_title="true",
                         yaxis={"autorange": "reversed", "type": "category"}, xaxis={"type": "category"},
                         margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return figure, caption

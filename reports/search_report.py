"""A search's report, for the command line, the Search page and the HTML download: its trials (parameters, value,
state, run), the best so far over time, the parameters' importance, parallel coordinates, the Pareto front where
there are two objectives, and its answer (the best settings as a launch command; for a speed search, what they
buy over the default, each trial's memory forecast beside what it measured).

    frame = trials_frame(engine, url, search)
    best_so_far_figure(frame, space); parallel_figure(frame, space); pareto_figure(frame, space)
    answer(frame, search)                          # the sentence and the settings to launch
    search_html(engine, url, search_id)

Optuna is imported by the functions that read the study (and only by the processes that call them).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from contract.config import ConfigError, RunConfig
from contract.fields import FIELDS
from contract.search_space import OBJECTIVES, SearchSpace, described
from db import store
from db.search_study import study_storage
from db.searches import SearchRecord, get_search, trial_runs
from reports.charts import base_figure, fit_y_axis
from reports.memory_check import estimate_check_frame
from reports.report_html import DASHBOARD_COLORS, REPORT_CSS, charts_html
from reports.scaling import epochs_frame

OBJECTIVE_LABELS = {"val_acc": "best validation accuracy", "images_per_s": "images/s",
                    "time_to_acc": "time to target (s)"}
VALUE_COLUMNS = {"val_acc": ("val_acc",), "images_per_s": ("images_per_s",), "time_to_acc": ("time_to_acc_s",),
                 "acc_and_speed": ("val_acc", "images_per_s")}
FINISHED = ("COMPLETE",)


def value_columns(space: SearchSpace) -> tuple[str, ...]:
    return VALUE_COLUMNS[space.objective]


def load_study(url: str, search: SearchRecord):
    """The search's study, or None while its driver has not made it yet."""
    import optuna

    storage = study_storage(url, create=False)
    if storage is None:
        return None
    try:
        return optuna.load_study(study_name=search.study_name, storage=storage)
    except KeyError:  # optuna: "Record does not exist": no driver has started the search yet
        return None


def trials_frame(engine, url: str, search: SearchRecord, study=None) -> pd.DataFrame:
    """One row per trial: trial, state, the values, each parameter, run_id, run_status, epochs (recorded),
    forecast_mb / measured_mb / memory_compared (the run's memory forecast against what it measured, at its
    device furthest off), started_at, finished_at. Empty (with the columns) before the first trial."""
    space = SearchSpace.from_dict(search.space)
    study = study if study is not None else load_study(url, search)
    columns = ["trial", "state", *value_columns(space), *space.names, "run_id", "run_status", "epochs",
               "forecast_mb", "measured_mb", "memory_compared", "started_at", "finished_at"]
    if study is None:
        return pd.DataFrame(columns=columns)
    runs = trial_runs(engine, search.id)
    run_ids = [run["id"] for run in runs.values()]
    epochs = epochs_frame(store.read_epoch_metrics(engine, run_ids)) if run_ids else epochs_frame([])
    checks = _memory_checks(engine, run_ids, epochs)
    rows = []
    for trial in study.get_trials(deepcopy=False):
        run = runs.get(trial.number) or {}
        run_id = run.get("id")
        # A pruned trial's value in Optuna is its last reported epoch's figure, not the objective: left out.
        complete = trial.state.name == "COMPLETE" and trial.values is not None
        values = trial.values if complete else [None] * len(value_columns(space))
        check = checks.get(run_id, {})
        rows.append({
            "trial": trial.number, "state": trial.state.name, **dict(zip(value_columns(space), values)),
            **{name: trial.params.get(name) for name in space.names}, "run_id": run_id,
            "run_status": run.get("status"), "epochs": int((epochs["run_id"] == run_id).sum()) if run_id else 0,
            "forecast_mb": check.get("estimated_mb"), "measured_mb": check.get("measured_mb"),
            "memory_compared": check.get("compared"), "started_at": trial.datetime_start,
            "finished_at": trial.datetime_complete,
        })
    return pd.DataFrame(rows, columns=columns)


def _memory_checks(engine, run_ids: list[int], epochs: pd.DataFrame) -> dict[int, dict]:
    """Each run's forecast against what it measured, at the device furthest off (reports/memory_check.py)."""
    runs = [{"id": r.id, "measurements": r.measurements} for r in (store.get_run(engine, i) for i in run_ids) if r]
    frame = estimate_check_frame(runs, epochs)
    checks: dict[int, dict] = {}
    for run_id, group in frame.groupby("run_id"):
        errors = group["error"].abs().fillna(0)
        checks[int(run_id)] = group.loc[errors.idxmax()].to_dict()
    return checks


def finished(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["state"].isin(FINISHED)]


def best_rows(frame: pd.DataFrame, space: SearchSpace) -> pd.DataFrame:
    """The best trial (one objective), or the Pareto front's trials (two), among the completed ones."""
    done = finished(frame)
    columns = value_columns(space)
    if done.empty:
        return done
    if len(columns) == 1:
        ascending = space.directions[0] == "minimize"
        return done.sort_values([columns[0], "trial"], ascending=[ascending, True]).head(1)
    return done[pareto_mask(done, columns)]


def pareto_mask(done: pd.DataFrame, columns: tuple[str, ...]) -> list[bool]:
    """Which rows no other row beats on every objective (all maximised) and on one at least."""
    points = done[list(columns)].to_numpy(dtype=float)
    return [not any((other >= point).all() and (other > point).any() for other in points) for point in points]


def best_so_far(frame: pd.DataFrame, space: SearchSpace) -> pd.DataFrame:
    """The best value after each completed trial, in the order trials finished (one objective)."""
    column = value_columns(space)[0]
    done = finished(frame).dropna(subset=["finished_at"]).sort_values("finished_at")
    values = done[column].astype(float)
    best = values.cummin() if space.directions[0] == "minimize" else values.cummax()
    return pd.DataFrame({"finished_at": done["finished_at"], "trial": done["trial"], "value": values, "best": best})


def best_so_far_figure(frame: pd.DataFrame, space: SearchSpace) -> go.Figure:
    label = OBJECTIVE_LABELS.get(value_columns(space)[0], value_columns(space)[0])
    # The legend sits where an x title would: the title says what the axis is.
    figure = base_figure("Best so far, by when each trial finished (UTC)", "", label,
                         percent=value_columns(space)[0] == "val_acc")
    if len(space.directions) > 1:
        return figure
    history = best_so_far(frame, space)
    history = history[history["value"].map(math.isfinite)]
    if history.empty:
        return figure
    figure.add_trace(go.Scatter(x=history["finished_at"], y=history["value"], mode="markers", name="trial",
                                marker=dict(color=DASHBOARD_COLORS[1]), text=[f"trial {t}" for t in history["trial"]]))
    figure.add_trace(go.Scatter(x=history["finished_at"], y=history["best"], mode="lines", line_shape="hv",
                                name="best so far", line=dict(color=DASHBOARD_COLORS[0])))
    return fit_y_axis(figure)


def parallel_figure(frame: pd.DataFrame, space: SearchSpace) -> go.Figure:
    """Parallel coordinates of the completed trials: one axis per parameter, then the (first) value; a choice's
    axis lists its values."""
    done = finished(frame)
    column = value_columns(space)[0]
    done = done[done[column].map(lambda v: isinstance(v, (int, float)) and math.isfinite(v))]
    figure = go.Figure()
    # The axes' labels sit above them: room between them and the title.
    figure.update_layout(title="Parallel coordinates (completed trials)", height=380, margin=dict(l=60, r=60, t=110, b=20))
    if done.empty:
        return figure
    dimensions = []
    for name in space.names:
        values = done[name]
        if values.map(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)).all():
            log = any(p.name == name and getattr(p, "log", False) for p in space.params)
            numbers = values.astype(float).map(math.log10) if log else values.astype(float)
            dimensions.append(dict(label=f"log10 {name}" if log else name, values=numbers))
        else:
            shown = values.map(str)
            levels = sorted(shown.unique())
            dimensions.append(dict(label=name, values=shown.map(levels.index), tickvals=list(range(len(levels))),
                                   ticktext=levels))
    dimensions.append(dict(label=OBJECTIVE_LABELS.get(column, column), values=done[column].astype(float)))
    figure.add_trace(go.Parcoords(dimensions=dimensions, line=dict(color=done[column].astype(float),
                                                                   colorscale=[[0, DASHBOARD_COLORS[1]],
                                                                               [1, DASHBOARD_COLORS[0]]])))
    return figure


def pareto_figure(frame: pd.DataFrame, space: SearchSpace) -> go.Figure:
    """Two objectives: every completed trial, the front's trials joined by a line."""
    figure = base_figure("Pareto front: accuracy and speed", "Best validation accuracy", "Images/s")
    figure.update_layout(hovermode="closest")
    done = finished(frame)
    if len(space.directions) < 2 or done.empty:
        return figure
    front = done[pareto_mask(done, value_columns(space))].sort_values("val_acc")
    figure.add_trace(go.Scatter(x=done["val_acc"], y=done["images_per_s"], mode="markers", name="trial",
                                marker=dict(color=DASHBOARD_COLORS[1]), text=[f"trial {t}" for t in done["trial"]]))
    figure.add_trace(go.Scatter(x=front["val_acc"], y=front["images_per_s"], mode="lines+markers", name="Pareto front",
                                marker=dict(color=DASHBOARD_COLORS[0]), line=dict(color=DASHBOARD_COLORS[0])))
    figure.update_xaxes(tickformat=".0%")
    return figure


def importances(study, space: SearchSpace) -> tuple[dict[str, float] | None, str | None]:
    """Each parameter's importance to the objective (with two, to reaching the Pareto front), by Optuna's PED-ANOVA
    evaluator (fast, no model fitted); None and the reason where it cannot be told yet."""
    import optuna

    if study is None:
        return None, "no trial has finished yet"
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) < 2:
        return None, f"{len(complete)} completed trial(s): importances need two at least"
    try:
        # With two objectives PED-ANOVA judges the parameters by the trials nearest the Pareto front.
        found = optuna.importance.get_param_importances(study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        return None, f"not computed: {exc}"
    return {name: float(value) for name, value in found.items()}, None


def importance_figure(found: dict[str, float] | None) -> go.Figure:
    figure = base_figure("Parameter importance (PED-ANOVA)", "Share of the objective's variation", "")
    figure.update_layout(hovermode="closest")
    if found:
        names = list(found)[::-1]
        figure.add_trace(go.Bar(x=[found[n] for n in names], y=names, orientation="h",
                                marker=dict(color=DASHBOARD_COLORS[0])))
        figure.update_xaxes(tickformat=".0%")
    return figure


def launch_flags(config: RunConfig) -> list[str]:
    """The flags of ``parallax launch`` that train ``config``: each field that differs from its default."""
    flags = []
    for name, spec in FIELDS.items():
        value = getattr(config, name)
        if value == spec.default or (value in ((), None) and spec.default in ((), None)):
            continue
        if spec.kind is bool and spec.parse is None:
            flags.append(spec.flag if value else f"--no-{spec.flag[2:]}")
        elif isinstance(value, tuple):
            flags += [spec.flag, spec.separator.strip().join(map(str, value)) or ","]
        else:
            flags += [spec.flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return flags


@dataclass(frozen=True)
class Answer:
    """What a search found: one sentence, and the best trial's config (None before a trial completed)."""

    sentence: str
    config: RunConfig | None
    trial: int | None = None

    @property
    def command(self) -> str | None:
        return None if self.config is None else " ".join(["parallax", "launch", *launch_flags(self.config)])


def answer(frame: pd.DataFrame, search: SearchRecord) -> Answer:
    """The best settings and what they bought: for a speed search, against the base's own settings (its first
    trial) when that was timed too."""
    space = SearchSpace.from_dict(search.space)
    base = RunConfig.from_dict(search.config)
    best = best_rows(frame, space)
    if best.empty:
        return Answer("No trial has completed yet.", None)
    row = best.iloc[0]
    values = {name: _plain(row[name]) for name in space.names}
    try:
        from contract.search_space import trial_config

        config = trial_config(base, values)
    except ConfigError as exc:  # a config a newer Parallax accepted, say
        return Answer(f"Trial {row['trial']} did best, but its settings cannot be launched here: {exc}", None)
    columns = value_columns(space)
    if len(columns) > 1:
        sentence = (f"{len(best)} trial(s) on the Pareto front of accuracy and speed; trial {row['trial']} ("
                    f"{described(values)}) reached {row['val_acc']:.1%} at {row['images_per_s']:,.0f} images/s.")
        return Answer(sentence, config, int(row["trial"]))
    value = float(row[columns[0]])
    shown = _shown_value(space, value)
    sentence = f"Best: trial {row['trial']} ({described(values)}), {OBJECTIVE_LABELS[columns[0]]} {shown}."
    if space.kind == "speed":
        default = {name: getattr(base, name) for name in space.names}
        done = finished(frame)
        baseline = done[[all(_plain(r[n]) == v for n, v in default.items()) for _, r in done.iterrows()]]
        if not baseline.empty and int(baseline.iloc[0]["trial"]) != int(row["trial"]):
            before = float(baseline.iloc[0][columns[0]])
            sentence = (f"Fastest: {described(values)} at {value:,.0f} images/s, {value / before:.2f}× the default "
                        f"settings ({described(default)}: {before:,.0f} images/s).")
        elif not baseline.empty:
            sentence = (f"The default settings ({described(default)}) are the fastest that fit here: {value:,.0f} "
                        "images/s.")
        else:
            sentence = (f"Fastest: {described(values)} at {value:,.0f} images/s (the default settings were not timed: "
                        "they do not fit, or the trials ran out first).")
    return Answer(sentence, config, int(row["trial"]))


def _plain(value: Any) -> Any:
    """A frame's cell as the plain value a config takes (numpy numbers become Python's)."""
    return value.item() if hasattr(value, "item") else value


def _shown_value(space: SearchSpace, value: float) -> str:
    if space.objective == "val_acc":
        return f"{value:.2%}"
    if space.objective == "time_to_acc":
        return "not reached" if math.isinf(value) else f"{value:,.1f} s"
    return f"{value:,.1f}"


def display_frame(frame: pd.DataFrame, space: SearchSpace) -> pd.DataFrame:
    """The trials as a table for people: numbers shown, runs as '#N', the memory forecast beside the measure."""
    shown = pd.DataFrame({"trial": frame["trial"], "state": frame["state"].str.lower(),
                          "run": frame["run_id"].map(lambda i: f"#{int(i)}" if pd.notna(i) else "—"),
                          "run status": frame["run_status"].fillna("—"), "epochs": frame["epochs"]})
    for column in value_columns(space):
        pattern = "{:.2%}" if column == "val_acc" else "{:,.1f}"
        shown[OBJECTIVE_LABELS.get(column, column)] = frame[column].map(
            lambda v, pattern=pattern: "—" if v is None or pd.isna(v) else "not reached" if math.isinf(v)
            else pattern.format(v))
    for name in space.names:
        shown[name] = frame[name].map(lambda v: "—" if v is None or (isinstance(v, float) and pd.isna(v))
                                      else f"{v:.3g}" if isinstance(v, float) else str(v))
    if frame["forecast_mb"].notna().any():
        shown["memory forecast (MB)"] = frame["forecast_mb"].map(lambda v: "—" if pd.isna(v) else f"{v:,.0f}")
        shown["measured (MB)"] = frame["measured_mb"].map(lambda v: "—" if pd.isna(v) else f"{v:,.0f}")
        shown["memory compared"] = frame["memory_compared"].fillna("—")
    return shown


MEMORY_NOTE = ("Memory forecast: the estimate made before each run, at the device furthest from what it measured; "
               "on GPUs the peak allocated, on CPU the parameters, gradients and optimizer state (a CPU keeps no "
               "peak of live tensors).")


def summary_lines(frame: pd.DataFrame, search: SearchRecord) -> list[str]:
    """What the command line prints when a search ends: counts by state, the answer, the command to launch it."""
    space = SearchSpace.from_dict(search.space)
    counts = frame["state"].str.lower().value_counts().to_dict()
    lines = [f"search {search.id}: {len(frame)} trial(s): "
             + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) + f"; objective {space.objective} ("
             + OBJECTIVES[space.objective][1] + ")"]
    found = answer(frame, search)
    lines.append(found.sentence)
    if found.command:
        lines.append(f"launch with these settings: {found.command}")
    return lines


def search_html(engine, url: str, search_id: int) -> str:
    """The search's report as one self-contained HTML page (plotly.js inline, opens offline)."""
    search = get_search(engine, search_id)
    if search is None:
        raise LookupError(f"no search with id {search_id}")
    space = SearchSpace.from_dict(search.space)
    study = load_study(url, search)
    frame = trials_frame(engine, url, search, study)
    found = answer(frame, search)
    weights, why_not = importances(study, space)
    figures = [best_so_far_figure(frame, space) if len(space.directions) == 1 else pareto_figure(frame, space),
               importance_figure(weights), parallel_figure(frame, space)]
    notes = list(search.notes) + ([f"Parameter importance: {why_not}"] if why_not else [])
    if frame["forecast_mb"].notna().any():
        notes.append(MEMORY_NOTE)
    command = f"<p><code>{html.escape(found.command)}</code></p>" if found.command else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Parallax search {search_id}</title>
<style>{REPORT_CSS}</style>
</head><body><h1>Search {search_id} ({search.kind}): {html.escape(OBJECTIVES[space.objective][1])}</h1>
<p><b>{html.escape(found.sentence)}</b></p>{command}
<p>{html.escape("; ".join(p.text for p in space.params))}; {space.trials} trials, {space.at_once} at once, sampler
{space.sampler}, pruner {space.pruner}; status {search.status}.</p>
{display_frame(frame, space).to_html(index=False)}
{"".join(f"<p>{html.escape(line)}</p>" for line in notes)}
{charts_html(figures)}</body></html>"""

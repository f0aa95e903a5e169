"""Runs: every run in one table; filter, sort, pick runs to open, compare or delete, and edit a
run's tags and note."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from db import dashboard
from db.run_figures import (BEST_VAL_ACC_LABEL, BEST_VAL_ACC_NAMES, name_key, IMAGES_PER_S_HELP, IMAGES_PER_S_LABEL, TRAINING_TIME_HELP,
                            TRAINING_TIME_LABEL)
from db.run_state import ACTIVE_STATUSES
from db.recorded_by import unknown_strategies_line
from trainer_backend.control.housekeeping import RunActiveError, delete_run_and_files
from ui import slurm_views, state
from ui.text import escape_markdown

state.enter_through_app("pages/runs.py")

PENDING_DELETE_KEY = "runs_pending_delete"
TABLE_VERSION_KEY = "runs_table_version"
# Each filter: (its name in the address, its label).
FILTERS = {"statuses": ("status", "Status"), "strategies": ("strategy", "Strategy"), "models": ("model", "Model"),
           "datasets": ("dataset", "Dataset"), "tags": ("tag", "Tag"), "kinds": ("kind", "Trained by")}
SORTS = {
    "Newest first": ("run", False),
    "Oldest first": ("run", True),
    "Best validation accuracy": (BEST_VAL_ACC_LABEL, False),
    "Throughput": (IMAGES_PER_S_LABEL, False),
    "Training time": (TRAINING_TIME_LABEL, False),
}

# Shown first, in this order: at 1,400 px the table shows about eight columns before it scrolls, and
# these say which run is which and how it did; the rest follow in the frame's order.
LEAD_COLUMNS = ("run", "status", "trained by", "strategy", "devices", "model", BEST_VAL_ACC_LABEL, IMAGES_PER_S_LABEL, "tags")


def dataset_name(dataset: str) -> str:
    """A folder dataset by its folder's name (its whole path is in the Dataset filter and on its Run
    page): a long path would take the table's width; built-in sets by name."""
    path = Path(dataset)
    return path.name if path.is_absolute() and path.name else dataset


MAX_SUMMARY_COLUMNS = 12  # a script's summary keys as columns, the most common first: a table, not a wall


def table_frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame({
        "run": [r["id"] for r in rows],
        "status": [r["status"] for r in rows],
        # "script": a user's own script logging through `import parallax`; "engine": launched by Parallax.
        "trained by": [r.get("kind", "engine") for r in rows],
        "strategy": [r["strategy"] for r in rows],
        "devices": [",".join(r["devices"]) for r in rows],
        "model": [r["model"] for r in rows],
        "dataset": [dataset_name(r["dataset"]) for r in rows],
        "batch": [r["batch_size"] for r in rows],
        "effective batch": [r["effective_batch"] for r in rows],
        "epochs": [f"{r['epochs_done']}/{r['epochs']}" for r in rows],
        BEST_VAL_ACC_LABEL: [r["best_val_acc"] for r in rows],
        IMAGES_PER_S_LABEL: [r["mean_images_per_s"] for r in rows],
        TRAINING_TIME_LABEL: [r["train_time_s"] for r in rows],
        "tags": [", ".join(r["tags"]) for r in rows],
        "note": [r["user_note"] for r in rows],
        "created (UTC)": [r["created_at"].replace(tzinfo=None) for r in rows],
    })
    # What scripts put in run.summary (beyond the figures above, which it fills): a column per key, as W&B shows.
    counts = pd.Series([key for r in rows for key in (r.get("summary") or {})
                        if name_key(key) not in BEST_VAL_ACC_NAMES], dtype=object).value_counts()
    for key in counts.index[:MAX_SUMMARY_COLUMNS]:
        column = f"summary: {key}"
        if column not in frame:
            frame[column] = summary_column([(r.get("summary") or {}).get(key) for r in rows])
    return frame


def summary_column(values: list) -> list:
    """A summary key's values as one column: numbers where every value given is a number (so it sorts as
    numbers), else each value's text; None where a run has no such key."""
    given = [v for v in values if v is not None]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in given):
        return [None if v is None else float(v) for v in values]
    return [None if v is None else str(v) for v in values]


def filters_from_url(choices: dict[str, list[str]]) -> None:
    """An address opened or edited (?status=failed&model=resnet18,vit_tiny) sets the filters; a value no run
    has is left out and said so."""
    for name, (param, label) in FILTERS.items():
        if not state.url_list_changed(param):
            continue
        wanted, key = state.url_list(param), f"filter_{name}"
        st.session_state[key] = [value for value in wanted if value in choices[name]]
        unknown = [value for value in wanted if value not in choices[name]]
        if unknown:
            shown = ", ".join(f"'{escape_markdown(value[:60])}'" for value in unknown)
            st.warning(f"No run has {label.lower()} {shown} (from ?{param}= in the address): that filter value is "
                       "left out.", icon=":material/filter_alt_off:")


def read_filters(choices: dict[str, list[str]]) -> dashboard.RunFilters:
    """The filters, kept in the address so that a filtered table can be bookmarked and sent."""
    filters_from_url(choices)
    picked = {
        name: tuple(column.multiselect(label, choices[name], key=f"filter_{name}", placeholder="all"))
        for column, (name, (_, label)) in zip(st.columns(len(FILTERS)), FILTERS.items())
    }
    for name, (param, _) in FILTERS.items():
        state.put_url_list(param, picked[name])
    return dashboard.RunFilters(**picked)


def delete_runs(run_ids: list[int]) -> None:
    deleted, refused = [], []
    for run_id in run_ids:
        try:
            delete_run_and_files(run_id)
            deleted.append(run_id)
        except (RunActiveError, LookupError) as exc:
            refused.append(str(exc))
    st.session_state.pop(PENDING_DELETE_KEY, None)
    st.session_state[TABLE_VERSION_KEY] = st.session_state.get(TABLE_VERSION_KEY, 0) + 1  # clears the selection
    if deleted:
        st.toast(f"Deleted run(s) {', '.join(f'#{i}' for i in deleted)}", icon=":material/delete:")
    for reason in refused:
        st.toast(reason, icon=":material/block:")


def confirm_delete(rows_by_id: dict[int, dict]) -> None:
    pending = [i for i in st.session_state.get(PENDING_DELETE_KEY, []) if i in rows_by_id]
    if not pending:
        return
    active = [i for i in pending if rows_by_id[i]["status"] in ACTIVE_STATUSES]
    deletable = [i for i in pending if i not in active]
    with st.container(border=True):
        for run_id in active:
            st.error(f"Run #{run_id} is {rows_by_id[run_id]['status']}: cancel it on its Run page first.")
        if deletable:
            st.warning(f"Delete {', '.join(f'#{i}' for i in deletable)} for good: the run, its metrics, log, "
                       "checkpoints and profiles?", icon=":material/warning:")
        yes, no, _ = st.columns([1, 1, 4])
        if deletable and yes.button("Yes, delete", type="primary", key="confirm_delete"):
            delete_runs(deletable)
            st.rerun()
        if no.button("Keep them", key="cancel_delete"):
            st.session_state.pop(PENDING_DELETE_KEY, None)
            st.rerun()


def edit_labels(row: dict) -> None:
    with st.form(f"labels_{row['id']}", border=True):
        st.markdown(f"**Tags and note of run #{row['id']}**")
        tags_text = st.text_input("Tags (comma-separated)", value=", ".join(row["tags"]))
        note = st.text_area("Note", value=row["user_note"], height=68)
        if st.form_submit_button("Save"):
            engine = state.engine()
            try:
                dashboard.set_tags(engine, row["id"], tags_text.split(","))
            except ValueError as exc:  # more tags, or longer ones, than a launch allows: nothing is saved
                st.error(escape_markdown(str(exc)), icon=":material/error:")
                return
            dashboard.set_user_note(engine, row["id"], note)
            st.toast(f"Saved tags and note of run #{row['id']}", icon=":material/check:")
            st.rerun()


st.title("Runs")
engine = state.engine_with_fresh_states()
choices = dashboard.filter_choices(engine)
if not choices["statuses"]:
    st.info("No runs yet.")
    st.page_link(state.LAUNCH_PAGE, label="Launch the first one", icon=":material/rocket_launch:")
    st.stop()

filters = read_filters(choices)
sort_col, order_col, _ = st.columns([2, 1, 3])
sort_by = sort_col.selectbox("Sort by", list(SORTS), key="sort_by")
column, ascending = SORTS[sort_by]
rows = dashboard.run_table(engine, filters)
rows_by_id = {row["id"]: row for row in rows}
frame = slurm_views.with_pending_reasons(table_frame(rows), engine)
frame = frame.sort_values(column, ascending=ascending, na_position="last", kind="stable").reset_index(drop=True)

st.caption(f"{len(frame)} run(s). Tick rows to open, compare or delete them.")
if newer := unknown_strategies_line([(row["id"], row["strategy"]) for row in rows if row["kind"] != "script"]):
    st.caption(escape_markdown(newer))
# A new key when filters, sorting or the data's ids change: a selection never points at another row.
table_key = f"runs_table_{st.session_state.get(TABLE_VERSION_KEY, 0)}_{hash((filters, sort_by, tuple(frame['run'])))}"
event = st.dataframe(
    frame, key=table_key, on_select="rerun", selection_mode="multi-row", hide_index=True,
    column_order=[*(c for c in LEAD_COLUMNS if c in frame), *(c for c in frame if c not in LEAD_COLUMNS)],
    column_config={
        "dataset": st.column_config.TextColumn(width="medium"),
        "run": st.column_config.NumberColumn(format="#%d", width="small"),
        BEST_VAL_ACC_LABEL: st.column_config.ProgressColumn(format="percent", min_value=0.0, max_value=1.0),
        IMAGES_PER_S_LABEL: st.column_config.NumberColumn(format="%.0f", help=IMAGES_PER_S_HELP),
        TRAINING_TIME_LABEL: st.column_config.NumberColumn(format="%.1f", help=TRAINING_TIME_HELP),
        "created (UTC)": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm"),
    },
)
picked = [int(frame.loc[i, "run"]) for i in event.selection.rows if i < len(frame)]

open_col, compare_col, delete_col, _ = st.columns([1, 1, 1, 3])
if open_col.button("Open run", icon=":material/monitoring:", disabled=len(picked) != 1):
    state.open_run(picked[0])
compare_label = f"Compare {len(picked)} runs" if len(picked) > 1 else "Compare"
if compare_col.button(compare_label, icon=":material/compare_arrows:", disabled=not picked):
    state.open_compare(picked)
if delete_col.button("Delete…", icon=":material/delete:", disabled=not picked):
    st.session_state[PENDING_DELETE_KEY] = picked
confirm_delete(rows_by_id)
if len(picked) == 1:
    edit_labels(rows_by_id[picked[0]])
elif picked:
    st.caption("Pick a single run to edit its tags and note.")

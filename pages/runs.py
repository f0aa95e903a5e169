"""Runs: every run in one table, a page at a time; search, filter (pickers and a filter line such as
``lr > 0.01 and best_val_acc >= 0.9``), sort, pick runs across pages to open, compare or delete, and edit a
run's tags and note. The database filters, sorts, counts and pages (``db.dashboard.run_page``): the page
reads 50 rows whatever the number of runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from db import dashboard, run_filters
from db.run_figures import (BEST_VAL_ACC_LABEL, BEST_VAL_ACC_NAMES, name_key, IMAGES_PER_S_HELP, IMAGES_PER_S_LABEL, TRAINING_TIME_HELP,
                            TRAINING_TIME_LABEL)
from db.run_state import ACTIVE_STATUSES
from db.recorded_by import unknown_strategies_line
from trainer_backend.control import run_deletion
from ui import slurm_views, state
from ui.text import escape_markdown

state.enter_through_app("pages/runs.py")

PENDING_DELETE_KEY = "runs_pending_delete"
DELETION_KEY = "runs_deletion"  # the deletion this session started, until its end has been shown
DELETION_REFRESH_S = 1.0
TABLE_VERSION_KEY = "runs_table_version"
PICKED_KEY = "runs_picked"  # {table key: the runs ticked in it}: picks on other pages stay picked
PAGES_KEY = "runs_pages"  # (what the pages are of, the cursors of the pages before this one and of this one)
SEARCH_KEY, WHERE_KEY = "runs_search", "runs_where"
SHOWN_IDS = 30  # picked runs named in a line; the rest counted
WHERE_HELP = ("NAME OP VALUE, joined by 'and': a config field (lr > 0.01, optimizer.name = adam), a figure "
              "(best_val_acc >= 0.9, images_per_s > 500, training_time_s < 60, epochs_done = 3), a column "
              "(strategy = ddp, status != failed, model ~ resnet, tag = baseline, note ~ sweep) or a script's "
              "summary (summary.val/acc > 0.9). OP: = != > >= < <= ~ (contains). Text in quotes may hold spaces.")
# Each filter: (its name in the address, its label).
FILTERS = {"statuses": ("status", "Status"), "strategies": ("strategy", "Strategy"), "models": ("model", "Model"),
           "datasets": ("dataset", "Dataset"), "tags": ("tag", "Tag"), "kinds": ("kind", "Trained by")}
SORTS = {
    "Newest first": "newest",
    "Oldest first": "oldest",
    "Best validation accuracy": "best_val_acc",
    "Throughput": "images_per_s",
    "Training time": "training_time_s",
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
        # "script": a user's own script logging through `import parallax`; "launched": launched by Parallax.
        "trained by": [r.get("kind", "launched") for r in rows],
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


def text_from_url(param: str, key: str) -> None:
    """An address opened or edited (?q=resnet, ?where=lr > 0.01) sets the search or the filter line."""
    if state.url_list_changed(param):
        st.session_state[key] = str(st.query_params.get(param))[:run_filters.MAX_LENGTH]


def read_filters(choices: dict[str, list[str]]) -> tuple[dashboard.RunFilters, st.delta_generator.DeltaGenerator]:
    """The filters, kept in the address so that a filtered table can be bookmarked and sent; and the place
    under the filter line where a malformed one is said."""
    filters_from_url(choices)
    text_from_url("q", SEARCH_KEY)
    text_from_url("where", WHERE_KEY)
    search_col, where_col = st.columns([2, 3])
    text = search_col.text_input("Search", key=SEARCH_KEY, placeholder="model, strategy, dataset, tag, note or #id")
    where = where_col.text_input("Filter", key=WHERE_KEY, help=WHERE_HELP,
                                 placeholder="lr > 0.01 and strategy = ddp and best_val_acc >= 0.9")
    picked = {
        name: tuple(column.multiselect(label, choices[name], key=f"filter_{name}", placeholder="all"))
        for column, (name, (_, label)) in zip(st.columns(len(FILTERS)), FILTERS.items())
    }
    for name, (param, _) in FILTERS.items():
        state.put_url_list(param, picked[name])
    state.put_url_list("q", [text] if text.strip() else [])
    state.put_url_list("where", [where] if where.strip() else [])
    return dashboard.RunFilters(**picked, where=where.strip(), text=text.strip()), where_col.empty()


def page_cursors(drawn_from: tuple) -> list:
    """The cursors of the pages before this one and of this one (None: the first page): a new filter or
    sort starts again from the first page."""
    pages = st.session_state.get(PAGES_KEY)
    if pages is None or pages[0] != drawn_from:
        pages = (drawn_from, [None])
        st.session_state[PAGES_KEY] = pages
    return pages[1]


def picked_runs() -> list[int]:
    """The runs ticked on every page, in the order ticked."""
    return list(dict.fromkeys(run_id for ids in st.session_state.get(PICKED_KEY, {}).values() for run_id in ids))


def shown_ids(run_ids: list[int]) -> str:
    """#3, #5, ... and N more: thousands of picked runs said in a line."""
    listed = ", ".join(f"#{i}" for i in run_ids[:SHOWN_IDS])
    return listed + (f" and {len(run_ids) - SHOWN_IDS:,} more" if len(run_ids) > SHOWN_IDS else "")


def delete_runs(run_ids: list[int]) -> None:
    """Start deleting the runs behind the page (``run_deletion``) and return at once: the table marks them
    while they go and a line above it counts them."""
    st.session_state[DELETION_KEY] = run_deletion.start_deletion(run_ids)
    st.session_state.pop(PENDING_DELETE_KEY, None)
    st.session_state.pop(PICKED_KEY, None)
    st.session_state[TABLE_VERSION_KEY] = st.session_state.get(TABLE_VERSION_KEY, 0) + 1  # clears the selection


def deletion_ended() -> None:
    """Say how this session's deletion ended, once: the runs deleted, and a line for each refused (or why it
    stopped)."""
    key = st.session_state.get(DELETION_KEY)
    job = run_deletion.deletion(key) if key is not None else None
    if job is not None and not job.finished:
        return
    st.session_state.pop(DELETION_KEY, None)
    if job is None:  # a deletion of a server since restarted: the runs not reached are still there
        return
    run_deletion.forget(key)
    if job.deleted:
        st.toast(f"Deleted run(s) {shown_ids(job.deleted)}", icon=":material/delete:")
    for reason in job.refused[:10]:
        st.warning(escape_markdown(reason), icon=":material/block:")


@st.fragment(run_every=DELETION_REFRESH_S)
def deletion_progress() -> None:
    """How far the deletions under way have gone (this tab's, or another's: a reload still shows it), redrawn
    each second; then the whole page again, without the runs."""
    key = st.session_state.get(DELETION_KEY)
    own = run_deletion.deletion(key) if key is not None else None
    under_way = run_deletion.progress_under_way()
    if (key is not None and (own is None or own.finished)) or under_way is None:
        st.rerun(scope="app")
    done, total = under_way
    st.progress(done / max(1, total), text=f"Deleting {done:,} of {total:,} runs…")


def confirm_delete(statuses: dict[int, str]) -> None:
    pending = [i for i in st.session_state.get(PENDING_DELETE_KEY, []) if i in statuses]
    if not pending:
        return
    active = [i for i in pending if statuses[i] in ACTIVE_STATUSES]
    deletable = [i for i in pending if i not in active]
    with st.container(border=True):
        for run_id in active[:SHOWN_IDS]:
            st.error(f"Run #{run_id} is {statuses[run_id]}: cancel it on its Run page first.")
        if len(active) > SHOWN_IDS:
            st.error(f"{len(active) - SHOWN_IDS:,} more picked runs are active: cancel them first.")
        if deletable:
            st.warning(f"Delete {shown_ids(deletable)} for good: the run, its metrics, log, checkpoints and "
                       "profiles?", icon=":material/warning:")
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
deletion_ended()
if st.session_state.get(DELETION_KEY) is not None or run_deletion.progress_under_way() is not None:
    deletion_progress()
engine = state.engine_with_fresh_states()
choices = dashboard.filter_choices(engine)
if not choices["statuses"]:
    st.info("No runs yet.")
    st.page_link(state.LAUNCH_PAGE, label="Launch the first one", icon=":material/rocket_launch:")
    st.stop()

filters, filter_problem = read_filters(choices)
sort_col, order_col, _ = st.columns([2, 1, 3])
sort_by = sort_col.selectbox("Sort by", list(SORTS), key="sort_by")
cursors = page_cursors((filters, sort_by))
try:
    page = dashboard.run_page(engine, filters, sort=SORTS[sort_by], after=cursors[-1])
except ValueError as exc:  # a malformed filter line: said under it, in one line
    filter_problem.error(escape_markdown(str(exc)), icon=":material/error:")
    st.stop()
rows = page.rows
frame = slurm_views.with_pending_reasons(table_frame(rows), engine)
frame.loc[frame["run"].isin(run_deletion.runs_being_deleted()), "status"] = "deleting"

first_shown = (len(cursors) - 1) * dashboard.PAGE_ROWS + 1
shown = f"{first_shown:,}–{first_shown + len(rows) - 1:,}" if rows else "none"
st.caption(f"{page.matching:,} run(s) match; showing {shown}. Tick rows to open, compare or delete them; "
           "ticks stay on other pages.", help="Filtered, sorted and paged in the database.")
if newer := unknown_strategies_line([(row["id"], row["strategy"]) for row in rows if row["kind"] != "script"]):
    st.caption(escape_markdown(newer))
# A new key for each page, filter, sort and set of ids: a selection never points at another row.
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
ticked = [int(frame.loc[i, "run"]) for i in event.selection.rows if i < len(frame)]
picks = st.session_state.setdefault(PICKED_KEY, {})
if ticked or table_key in picks:
    picks[table_key] = ticked
picked = picked_runs()

back_col, next_col, picked_col = st.columns([1, 1, 4], vertical_alignment="center")
if back_col.button("Previous page", icon=":material/chevron_left:", disabled=len(cursors) == 1):
    cursors.pop()
    st.rerun()
if next_col.button("Next page", icon=":material/chevron_right:", disabled=page.next_after is None):
    cursors.append(page.next_after)
    st.rerun()
if len(picked) > len(ticked):
    picked_col.caption(f"Picked on every page: {shown_ids(picked)}")

open_col, compare_col, delete_col, clear_col, _ = st.columns([1, 1, 1, 1, 2])
if open_col.button("Open run", icon=":material/monitoring:", disabled=len(picked) != 1):
    state.open_run(picked[0])
compare_label = f"Compare {len(picked)} runs" if len(picked) > 1 else "Compare"
if compare_col.button(compare_label, icon=":material/compare_arrows:", disabled=not picked):
    state.open_compare(picked)
if delete_col.button("Delete…", icon=":material/delete:", disabled=not picked):
    st.session_state[PENDING_DELETE_KEY] = picked
if clear_col.button("Clear picks", icon=":material/deselect:", disabled=not picked):
    st.session_state.pop(PICKED_KEY, None)
    st.session_state[TABLE_VERSION_KEY] = st.session_state.get(TABLE_VERSION_KEY, 0) + 1
    st.rerun()
confirm_delete(dashboard.run_statuses(engine, st.session_state.get(PENDING_DELETE_KEY, [])))
rows_by_id = {row["id"]: row for row in rows}
if len(picked) == 1 and picked[0] in rows_by_id:
    edit_labels(rows_by_id[picked[0]])
elif picked:
    st.caption("Pick a single run on this page to edit its tags and note.")

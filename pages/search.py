"""Search: one search's trials (parameters, value, state, a link to each run), its answer with a "Launch with these
settings" button, the best so far over time (or the Pareto front of accuracy and speed), the parameters'
importance and parallel coordinates, live while the search runs, and its report as HTML. ``?search=N`` picks it.

A search is started from the Launch page ("Search") or the command line (``parallax search``); its driver is a
process of its own, so the page only reads: it can stop the search, or resume one whose driver is gone."""

from __future__ import annotations

import time

import streamlit as st

from contract.environment import database_url
from contract.search_space import OBJECTIVES, SearchSpace
from db import store
from db.run_state import ACTIVE_STATUSES
from db.searches import get_search, list_searches, trial_runs
from reports.search_report import (MEMORY_NOTE, answer, best_so_far_figure, display_frame, importance_figure,
                                   importances, load_study, parallel_figure, pareto_figure, search_html, trials_frame)
from trainer_backend.control.search_lifecycle import check_resumable, start_detached_driver, stop_search
from ui import launch_memory, live, options, state
from ui.text import escape_markdown

state.enter_through_app("pages/search.py")
MAX_RUN_LINKS = 36  # the newest trials' runs get a link; every run is on the Runs page too


def search_label(search) -> str:
    space = SearchSpace.from_dict(search.space)
    return (f"Search #{search.id} · {search.kind} · {', '.join(space.names)} · {search.status} · "
            f"{search.created_at:%Y-%m-%d %H:%M} UTC")


def progress_version(engine, search_id: int) -> tuple:
    """What the trials table is drawn from: each trial's run, its status and last epoch (two indexed reads)."""
    runs = trial_runs(engine, search_id)
    last = store.last_epochs(engine, [run["id"] for run in runs.values()])
    return tuple(sorted((number, run["id"], run["status"], last.get(run["id"], 0)) for number, run in runs.items()))


def watch(search_id: int, drawn: tuple, status: str, drawn_at: float) -> None:
    """The fragment's tick: the page runs again when a trial starts or ends (at once) or records an epoch (as
    often as ``live.redraw_due`` allows); otherwise nothing is sent."""
    engine = state.engine_with_fresh_states()
    now = progress_version(engine, search_id)
    ended_or_started = [r[:3] for r in now] != [r[:3] for r in drawn]
    search = get_search(engine, search_id)
    if live.redraw_due(ended_or_started or search.status != status, now != drawn, drawn_at):
        st.rerun()


def driver_line(search) -> None:
    """Who drives the search now, and the one action that applies: stop it, or resume it."""
    if search.driven_here_by_a_live_process:
        left, right = st.columns([4, 1], vertical_alignment="center")
        left.caption(f"Driven by process {search.driver_pid} on {escape_markdown(search.driver_host)}: it starts "
                     "the trials, prunes the hopeless ones and tells the study how each ended.")
        if right.button("Stop the search", icon=":material/stop_circle:", key="stop_search",
                        help="Its running trials are cancelled (their epochs kept); Resume carries on later."):
            st.toast(escape_markdown(stop_search(search.id)))
        return
    if search.status == "finished":
        return
    if search.driver_pid is not None:
        st.warning(f"This search's driver (process {search.driver_pid} on {escape_markdown(search.driver_host)}) is "
                   "not running here: its trials still training go on, but none is judged or started. Resume carries "
                   "on from where it is.", icon=":material/warning:")
    elif search.status == "running":
        st.info("No driver has taken this search yet: one started from here records itself within seconds (if none "
                f"does, its log `search-{search.id}.log` beside the runs' folders says why). Resume starts one.",
                icon=":material/hourglass_top:")
    else:
        st.info("This search was stopped. Resume carries on: trials still training are followed again and new ones "
                "drawn up to its budget.", icon=":material/pause_circle:")
    if st.button("Resume the search", icon=":material/play_circle:", key="resume_search",
                 help=f"Starts a driver in the background, as `parallax search --resume {search.id}` does."):
        try:
            check_resumable(search.id)
            start_detached_driver(search.id, data_roots=options.data_roots())
        except (ValueError, LookupError, OSError) as exc:
            st.error(escape_markdown(exc), icon=":material/error:")
        else:
            time.sleep(1.0)  # the driver records itself within a moment: the page then shows it
            st.rerun()


def show_answer(frame, search) -> None:
    found = answer(frame, search)
    if found.config is None:
        st.info(escape_markdown(found.sentence), icon=":material/hourglass_top:")
        return
    st.success(escape_markdown(found.sentence), icon=":material/lightbulb:")
    st.code(found.command, language="bash")
    if st.button("Launch with these settings", type="primary", icon=":material/rocket_launch:", key="launch_best"):
        launch_memory.remember(launch_memory.FormStart(
            found.config, said=f"The form holds search #{search.id}'s best settings (trial {found.trial}): "
            "check them, then launch."))
        st.switch_page(state.LAUNCH_PAGE)


def show_search(engine, search) -> None:
    space = SearchSpace.from_dict(search.space)
    st.caption(f"**{search.kind}** search · objective: {escape_markdown(OBJECTIVES[space.objective][1])} · "
               f"{escape_markdown('; '.join(p.text for p in space.params))} · {space.trials} trials, "
               f"{space.at_once} at once · sampler {space.sampler}, pruner {space.pruner}")
    driver_line(search)
    drawn = progress_version(engine, search.id)
    active = search.driven_here_by_a_live_process or any(r[2] in ACTIVE_STATUSES for r in drawn)
    st.fragment(watch, run_every=live.REFRESH_S if active else None)(search.id, drawn, search.status,
                                                                      time.monotonic())
    study = load_study(database_url(), search)
    frame = trials_frame(engine, database_url(), search, study)
    show_answer(frame, search)
    if frame.empty:
        st.info("No trial yet: the search's driver draws the first ones as it starts.", icon=":material/hourglass_top:")
    else:
        st.dataframe(display_frame(frame, space), hide_index=True, key="search_trials",
                     column_config={"run": st.column_config.TextColumn(help="Open it from the Run page: ?run=N")})
        linked = frame.dropna(subset=["run_id"]).tail(MAX_RUN_LINKS)
        links = st.columns(max(1, min(6, len(linked))))
        for index, row in enumerate(linked.itertuples()):
            links[index % len(links)].page_link(state.RUN_PAGE, label=f"Trial {row.trial}: run #{int(row.run_id)}",
                                                query_params={"run": int(row.run_id)}, icon=":material/monitoring:")
    for note in search.notes:
        st.caption(escape_markdown(note))
    if frame["forecast_mb"].notna().any():
        st.caption(MEMORY_NOTE)
    left, right = st.columns(2)
    if len(space.directions) > 1:
        left.plotly_chart(pareto_figure(frame, space), key="search_pareto")
    else:
        left.plotly_chart(best_so_far_figure(frame, space), key="search_history")
    weights, why_not = importances(study, space)
    right.plotly_chart(importance_figure(weights), key="search_importance")
    if why_not:
        right.caption(f"Parameter importance: {escape_markdown(why_not)}.")
    st.plotly_chart(parallel_figure(frame, space), key="search_parallel")


st.title("Search")
engine = state.engine_with_fresh_states()
searches = list_searches(engine)
if not searches:
    st.info("No searches yet. A search varies fields of a run (learning rate, batch size, model …) and keeps the best, "
            "pruning hopeless trials early; a speed search finds the fastest settings that fit this machine. On the "
            "Launch page choose **Search**, or run `parallax search --param lr=1e-4:1e-1:log --trials 8`.")
    st.page_link(state.LAUNCH_PAGE, label="Launch a search", icon=":material/rocket_launch:")
    st.stop()
labels = {search.id: search_label(search) for search in searches}
ids = list(labels)
if problem := state.unknown_url_id("search", ids, noun="Search"):
    st.error(problem, icon=":material/error:")
    st.page_link(state.SEARCH_PAGE, label="All searches", icon=":material/travel_explore:")
    st.stop()
wanted = state.requested_id("search", state.SEARCH_ID_KEY)
search_id = st.selectbox("Search", ids, index=ids.index(wanted) if wanted in ids else 0,
                         format_func=labels.__getitem__, key="search_picker")
if search_id != wanted:
    st.query_params["search"] = search_id
    st.session_state[state.SEARCH_ID_KEY] = search_id
search = get_search(engine, search_id)
show_search(engine, search)
st.download_button(
    "Download the report (HTML)", lambda: search_html(engine, database_url(), search_id),
    file_name=f"parallax-search-{search_id}.html", mime="text/html", on_click="ignore", icon=":material/download:",
    help="One self-contained page (charts included) that opens offline.")

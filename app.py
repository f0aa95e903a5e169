"""Parallax dashboard entry point: ``make run`` (or ``streamlit run app.py`` from this folder).

Eight pages: Launch a run (or a sweep of strategies, or a search), watch one Run live, browse all Runs, Compare
runs and strategies, read a strategy Sweep's scaling report, follow a Search's trials, dig into a run's Profiler
output, and the home's Settings (the webhooks told when a run ends).
Runs started here are detached processes: they go on when the browser tab or the dashboard closes.

This file has two lives. ``streamlit run app.py`` imports it as a module, finds ``app`` below and serves it
(Streamlit's server with the headers and routes of ui/serving.py); then Streamlit runs it as the page
script (``__main__``) for every rerun of every session, which draws the dashboard.
"""

from __future__ import annotations

import os

import streamlit as st
from streamlit.starlette import App

from db.access import open_database
from db.connection import masked_url
from contract.environment import database_url, keep_files_private, parallax_home
from ui import auth, serving
from ui.state import (COMPARE_PAGE, LAUNCH_PAGE, PROFILER_PAGE, RUN_PAGE, RUNS_PAGE, SEARCH_PAGE, SETTINGS_PAGE,
                      SWEEP_PAGE, return_to_requested_page)


def show_dashboard() -> None:
    """One run of the page script: the checks every page is behind, the navigation, the page asked for."""
    st.set_page_config(page_title="Parallax", page_icon=":material/stacks:", layout="wide")
    # No "Deploy" in the toolbar: .streamlit/config.toml's client.toolbarMode (set here, it came too late).

    # Before any page: only requests for this dashboard's own host names, and only after a login where one is
    # configured or the address is reachable from other machines (ui/auth.py).
    auth.require_access()
    try:
        keep_files_private()  # what the dashboard and the runs it launches write is private (contract/environment.py)
        open_database()
    except ValueError as exc:  # DatabaseUnavailable, or a PARALLAX_HOME that cannot be a folder
        auth.stop_with_page(lambda message=str(exc): st.error(message, icon=":material/database:"))

    navigation = st.navigation([
        st.Page(LAUNCH_PAGE, title="Launch", icon=":material/rocket_launch:", default=True),
        st.Page(RUN_PAGE, title="Run", icon=":material/monitoring:"),
        st.Page(RUNS_PAGE, title="Runs", icon=":material/table_rows:"),
        st.Page(COMPARE_PAGE, title="Compare", icon=":material/compare_arrows:"),
        st.Page(SWEEP_PAGE, title="Sweeps", icon=":material/stacked_bar_chart:"),
        st.Page(SEARCH_PAGE, title="Search", icon=":material/travel_explore:"),
        st.Page(PROFILER_PAGE, title="Profiler", icon=":material/speed:"),
        st.Page(SETTINGS_PAGE, title="Settings", icon=":material/settings:"),
    ])

    with st.sidebar:
        st.caption("Parallax trains image classifiers under different parallel strategies and compares what "
                   "each buys.")
        kept = f"Runs, logs and checkpoints are kept in `{parallax_home()}`"
        if os.environ.get("PARALLAX_DB_URL"):
            kept += f"; the database is `{masked_url(database_url())}`"
        st.caption(kept + ".")

    return_to_requested_page()
    navigation.run()


if __name__ == "__main__":
    show_dashboard()
else:
    serving.record_own_url()  # where the runs' messages link to: this dashboard, on the port it was started on
    app = App(__file__, routes=serving.routes(), middleware=serving.middleware())

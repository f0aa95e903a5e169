"""What the pages share: the cached database connection (a SQLAlchemy engine), the page paths, and moving between pages
with the run (or runs) to show.

The engine is cached per database URL with ``st.cache_resource``: one pool for every user and
rerun, and a different ``PARALLAX_HOME`` gets its own engine rather than a stale one.
"""

from __future__ import annotations

from collections.abc import Iterable

import streamlit as st
from sqlalchemy import Engine

from db import make_engine
from db.connection import DatabaseUnavailable
from db.run_state import mark_lost_runs
from trainer_backend.control.slurm_status import watch_slurm_runs
from contract.environment import database_url
from db.store import MAX_ID, parse_id
from ui.text import escape_markdown

LAUNCH_PAGE = "pages/launch.py"
RUN_PAGE = "pages/run.py"
RUNS_PAGE = "pages/runs.py"
COMPARE_PAGE = "pages/compare.py"
PROFILER_PAGE = "pages/profiler.py"
SWEEP_PAGE = "pages/sweep.py"
SEARCH_PAGE = "pages/search.py"
SETTINGS_PAGE = "pages/settings.py"
ALL_PAGES = (LAUNCH_PAGE, RUN_PAGE, RUNS_PAGE, COMPARE_PAGE, PROFILER_PAGE, SWEEP_PAGE, SEARCH_PAGE)

APP_RAN_KEY = "app_entry_ran"  # set by app.py on every run of this session
RETURN_TO_KEY = "return_to_page"  # (page, query params) to reopen once app.py has set up navigation
RUN_ID_KEY = "run_id"  # the run the Run page shows
COMPARE_IDS_KEY = "compare_ids"  # the runs the Compare page starts with
SWEEP_ID_KEY = "sweep_id"  # the sweep the Sweep page shows
LOG_LOSS_KEY = "loss_log_scale"  # the Run page's switch: its loss charts (a script's too) on a log axis
SEARCH_ID_KEY = "search_id"  # the search the Search page shows
URL_SYNCED_KEY = "url_synced"  # {param: what this session last put in the address for it}


@st.cache_resource(show_spinner=False)
def engine_for(url: str) -> Engine:
    return make_engine(url)


def engine() -> Engine:
    """The engine; a database that cannot be opened stops the page with one line saying why."""
    try:
        return engine_for(database_url())
    except DatabaseUnavailable as exc:  # not cached: the next rerun tries again
        st.error(str(exc))
        st.stop()


def engine_with_fresh_states() -> Engine:
    """The engine, after marking runs whose process has died as lost: no page ever shows a dead
    run as running, and a lost run can be deleted."""
    current = engine()
    mark_lost_runs(current)
    watch_slurm_runs(current)  # one squeue per 10 s for every tab, and only while a Slurm run is active
    return current


def enter_through_app(page: str) -> None:
    """Send a page that was opened without ``app.py`` back through it, then to itself.

    Until ``app.py`` has called ``st.navigation`` once in a server process, Streamlit treats the
    ``pages/`` folder the old way: a first request for ``/run?run=3`` (a bookmark, a tab open
    across a restart) runs that page alone, without the app's layout and navigation.
    """
    if st.session_state.get(APP_RAN_KEY):
        return
    st.session_state[RETURN_TO_KEY] = (page, st.query_params.to_dict())
    st.switch_page("app.py")


def return_to_requested_page() -> None:
    """In app.py, after navigation is set up: reopen the page ``enter_through_app`` came from."""
    st.session_state[APP_RAN_KEY] = True
    if RETURN_TO_KEY in st.session_state:
        page, query_params = st.session_state.pop(RETURN_TO_KEY)
        st.switch_page(page, query_params=query_params)


def open_run(run_id: int) -> None:
    """Go to the Run page showing ``run_id`` (the id also lands in the URL: ?run=N)."""
    st.session_state[RUN_ID_KEY] = int(run_id)
    st.switch_page(RUN_PAGE, query_params={"run": int(run_id)})


def open_compare(run_ids: Iterable[int]) -> None:
    """Go to the Compare page with ``run_ids`` picked (?runs=3,5,8)."""
    ids = [int(i) for i in run_ids]
    st.session_state[COMPARE_IDS_KEY] = ids
    st.switch_page(COMPARE_PAGE, query_params={"runs": ",".join(map(str, ids))})


MAX_URL_ITEMS = 100  # a list in the address longer than this is cut: no page picks more


def url_list(param: str) -> list[str] | None:
    """The values of ``?param=a,b,c`` in the address, in order; None when the address has no ``param``."""
    raw = st.query_params.get(param)
    if raw is None:
        return None
    return [value.strip() for value in str(raw).split(",") if value.strip()][:MAX_URL_ITEMS]


def url_list_changed(param: str) -> bool:
    """Whether the address holds a ``?param=`` this session did not put there: a bookmark or link opened,
    or an address edited. Then the address decides; otherwise the page's widgets do (a rerun after a
    widget changed still carries the address as it was)."""
    raw = st.query_params.get(param)
    return raw is not None and raw != st.session_state.get(URL_SYNCED_KEY, {}).get(param)


def put_url_list(param: str, values: Iterable) -> None:
    """Show ``values`` in the address as ``?param=a,b,c`` (none: no ``param``), so the page's state can be
    bookmarked and sent."""
    encoded = ",".join(str(value) for value in values)
    st.session_state.setdefault(URL_SYNCED_KEY, {})[param] = encoded or None
    if not encoded:
        if param in st.query_params:
            del st.query_params[param]
    elif st.query_params.get(param) != encoded:
        st.query_params[param] = encoded


def url_run_ids(param: str, known_ids: Iterable[int]) -> tuple[list[int], list[str]]:
    """The runs ``?param=3,5,8`` names that exist here, and one message for each part that names none:
    a wrong or foreign id is left out and said so, never replaced by another run."""
    known, found, problems = set(known_ids), [], []
    for part in url_list(param) or []:
        wanted = parse_id(part)
        if wanted is None:
            problems.append(f"'{escape_markdown(part[:40])}' in ?{param}= in the address is not a run number: "
                            f"each must be a whole number from 1 to {MAX_ID}, e.g. ?{param}=3,5,8.")
        elif wanted not in known:
            problems.append(f"Run #{wanted} in the address does not exist (it may have been deleted): it is left out.")
        elif wanted not in found:
            found.append(wanted)
    return found, problems


def open_sweep(sweep_id: int) -> None:
    """Go to the Sweep page showing ``sweep_id`` (?sweep=N)."""
    st.session_state[SWEEP_ID_KEY] = int(sweep_id)
    st.switch_page(SWEEP_PAGE, query_params={"sweep": int(sweep_id)})


def open_search(search_id: int) -> None:
    """Go to the Search page showing ``search_id`` (?search=N)."""
    st.session_state[SEARCH_ID_KEY] = int(search_id)
    st.switch_page(SEARCH_PAGE, query_params={"search": int(search_id)})


def requested_id(param: str, session_key: str) -> int | None:
    """The id asked for by the URL (?param=N), else the last one opened in this session."""
    raw = st.query_params.get(param)
    if raw is not None and (wanted := parse_id(raw)) is not None:
        return wanted
    return st.session_state.get(session_key)


def unknown_url_id(param: str, known_ids, noun: str = "Run") -> str | None:
    """Why the id in the URL (?param=N) names nothing here, or None (also when there is none).
    A page shows this instead of falling back to another item: a link never serves another run's files."""
    raw = st.query_params.get(param)
    if raw is None:
        return None
    wanted = parse_id(raw)
    if wanted is None:
        shown = escape_markdown(str(raw)[:40])
        return (f"?{param}={shown} in the address is not a {noun.lower()} number: it must be a whole number from 1 "
                f"to {MAX_ID}, e.g. ?{param}=3.")
    if wanted not in set(known_ids):
        return f"{noun} #{wanted} in the address does not exist (it may have been deleted): nothing of it is shown."
    return None


def requested_sweep_id() -> int | None:
    return requested_id("sweep", SWEEP_ID_KEY)


def requested_run_id() -> int | None:
    """The run asked for by the URL (?run=N), else the last one opened in this session."""
    return requested_id("run", RUN_ID_KEY)

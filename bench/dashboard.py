"""Dashboard: how long the Runs, Compare and Run pages take to render with 500 runs of 50 epochs.

A fresh SQLite database is filled with 500 runs (single, ddp, dp and mp, each with 50 epochs of
metrics; the newest one running, with a live process and heartbeat). The app is driven with
Streamlit's AppTest from ``app.py``, switching pages in turn (Runs, Compare, Run), five times
each; a render is one full script run of the app and the page, as a browser navigation causes.
The Compare page gets four runs of different strategies (as the Runs page sends them). The Run
page shows the running run; its live part is an ``st.fragment`` that reruns alone every few
seconds: one tick is timed as that fragment's body, measured by wrapping ``st.fragment`` while
the page renders. The first render of each page (imports, caches) is reported apart.

    python bench/dashboard.py            # full: 500 runs x 50 epochs, 5 repeats
    python bench/dashboard.py --quick    # 20 runs x 5 epochs, one repeat
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, parallax_home, parse_args  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import alternate, at_most, timed_calls  # noqa: E402

METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
PAGES = {"Runs": "pages/runs.py", "Compare": "pages/compare.py", "Run": "pages/run.py"}
STRATEGIES = (("single", ("cpu",)), ("ddp", ("cpu", "cpu")), ("dp", ("cpu",)), ("mp", ("cpu", "cpu")))
FRAGMENT_TICKS_S: list[float] = []  # every fragment body run, in order
LIVE_TICKS_S: list[float] = []  # the Run page's fragment, one per render


def fill_database(url: str, runs: int, epochs: int) -> dict:
    """``runs`` runs of ``epochs`` epochs each; returns the ids the pages are shown with."""
    from sqlalchemy import insert, update

    from db import run_state, make_engine, store
    from db.connection import session_scope
    from db.tables import EpochMetric, Run, utcnow
    from contract.config import RunConfig

    engine = make_engine(url)
    now = utcnow()
    ids = []
    for index in range(runs):
        strategy, devices = STRATEGIES[index % len(STRATEGIES)]
        config = RunConfig(strategy=strategy, devices=devices, epochs=epochs, batch_size=128,
                           tags=("sweep",) if index % 10 == 0 else ()).to_dict()
        run_id = store.create_run(engine, config, status="running", world_size=len(devices) if strategy == "ddp" else 1)
        ids.append(run_id)
        started = now - timedelta(hours=runs - index)
        with session_scope(engine) as session:
            session.execute(update(Run).where(Run.id == run_id).values(created_at=started, started_at=started))
        speed = 500.0 * (1.6 if strategy == "ddp" else 1.0)
        rows = [{
            "run_id": run_id, "epoch": epoch, "train_loss": 2.3 / epoch, "train_acc": 1 - 0.9 / epoch,
            "val_loss": 2.4 / epoch, "val_acc": 1 - 0.95 / epoch, "epoch_time_s": 3.0, "train_time_s": 2.7,
            "images_per_s": speed + epoch, "lr": 1e-3, "peak_memory_mb": {"cpu": 900.0 + epoch},
            "created_at": started + timedelta(seconds=3 * epoch),
        } for epoch in range(1, epochs + 1)]
        with session_scope(engine) as session:
            session.execute(insert(EpochMetric), rows)
        store.refresh_figures(engine, run_id)  # the figures the Runs page sorts by, as log_epoch keeps them
        if index < runs - 1:
            run_state.finish(engine, run_id, "completed")
    live = ids[-1]
    # The newest run is 'running' in this very process, so no reader marks it lost.
    store.set_process(engine, live, pid=os.getpid(), host=socket.gethostname())
    run_state.heartbeat(engine, live)
    run_state.set_progress(engine, live, epoch=epochs, step=5, total_steps=12)
    completed = ids[:-1]
    return {"live": live, "compare": completed[-len(STRATEGIES):]}


def time_fragments() -> None:
    """Wrap st.fragment so that every fragment body records how long it ran."""
    import streamlit as st

    real = st.fragment

    def timed_fragment(func=None, *, run_every=None):
        if func is None:
            return lambda f: timed_fragment(f, run_every=run_every)

        return real(timed_calls(func, FRAGMENT_TICKS_S.append), run_every=run_every)

    st.fragment = timed_fragment


def check_page(at, page: str) -> None:
    """A render that raised, or shows no table or chart, is not a render worth timing."""
    if at.exception:
        raise RuntimeError(f"{page} raised: {at.exception[0].value}")
    shown = len(at.get("dataframe")) + len(at.get("plotly_chart")) + len(at.get("arrow_data_frame"))
    if shown == 0:
        raise RuntimeError(f"{page} rendered no table or chart: {[e.type for e in at.main]}")


def render(at, page: str, ids: dict) -> float:
    from ui import state

    if page == "Compare":
        at.session_state[state.COMPARE_IDS_KEY] = list(ids["compare"])
    if page == "Run":
        at.query_params["run"] = str(ids["live"])
        at.session_state[state.RUN_ID_KEY] = ids["live"]
    at.switch_page(PAGES[page])
    FRAGMENT_TICKS_S.clear()
    start = time.perf_counter()
    at.run()
    seconds = time.perf_counter() - start
    check_page(at, page)
    if page == "Run":
        if not FRAGMENT_TICKS_S:
            raise RuntimeError("the Run page ran no st.fragment: there is no live part to time")
        LIVE_TICKS_S.append(sum(FRAGMENT_TICKS_S))
    return seconds


def main() -> None:
    args = parse_args(__doc__)
    runs, epochs = (20, 5) if args.quick else (500, 50)
    report = Report("dashboard", "Dashboard", method=METHOD)
    report.settings = {"runs": runs, "epochs_per_run": epochs, "repeats": args.repeats}
    missing = [path for path in PAGES.values() if not (ROOT / path).exists()]
    if missing:
        report.skip(f"the dashboard pages {', '.join(missing)} do not exist yet")
        report.finish(args)
        return
    with parallax_home() as home:
        url = f"sqlite:///{home / 'parallax.db'}"
        started = time.perf_counter()
        ids = fill_database(url, runs, epochs)
        report.details["fill_s"] = time.perf_counter() - started
        from streamlit.testing.v1 import AppTest

        # Driving AppTest from this thread makes Streamlit warn that no page runs here; none should.
        # (A filter, because Streamlit resets its loggers' levels whenever it reads its config.)
        logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(
            lambda record: "missing ScriptRunContext" not in record.getMessage())
        time_fragments()
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
        at.run()  # the default page, to register the navigation before switching pages
        first = {page: render(at, page, ids) for page in PAGES}
        LIVE_TICKS_S.clear()
        times = alternate({page: functools.partial(render, at, page, ids) for page in PAGES}, args.repeats)
    report.add("Runs page render", times["Runs"], unit=" s", target=at_most(1.0))
    report.add("Compare page render (4 runs)", times["Compare"], unit=" s", target=at_most(1.0))
    report.add("Run page live tick (fragment)", LIVE_TICKS_S, unit=" s", target=at_most(0.2))
    report.add("Run page full render", times["Run"], unit=" s", headline=False)
    for page, seconds in first.items():
        report.add(f"{page} page first render (imports, caches)", [seconds], unit=" s", headline=False)
    report.note(f"Filling the database took {report.details['fill_s']:.1f} s.")
    report.finish(args)


if __name__ == "__main__":
    main()

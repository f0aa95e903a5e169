"""Searches through AppTest: the Search page on searches built in the database (their runs with ``db.store``, their
studies with Optuna in the same database): trials, the answer and its "Launch with these settings" button, the
charts, a Pareto front for two objectives, a search whose driver is gone offered for resuming; and the Launch
page's Search mode, which checks every value as the command line does and starts a real search.

    .venv/bin/python -m pytest tests/pages/test_search.py -q
"""

from __future__ import annotations

import socket
import time

import optuna
import pytest
from streamlit.testing.v1 import AppTest

from contract.search_space import SearchSpace, parse_param
from db import store
from db import run_state as state
from db.search_study import forget_storages, study_storage
from db.searches import claim_driver, create_search, get_search, list_searches, release_driver, trial_runs
from tests.nvml_machines import cpu_machine, fake_nvml  # noqa: F401
from tests.support import ROOT
from trainer_backend.control.search_lifecycle import stop_search
from trainer_backend.control.search_driver import suggest

APP = str(ROOT / "app.py")
TIMEOUT_S = 90
BASE = {"dataset": "digits", "model": "test_resnet", "strategy": "single", "devices": ["cpu"], "batch_size": 64,
        "epochs": 2, "image_size": 32}


def open_page(page: str, **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.switch_page(page)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def make_search(engine, url: str, space: SearchSpace, trials: list[tuple[dict, str, tuple, list[dict]]]) -> int:
    """A search whose trials have run: each (params, Optuna state name, values, epochs), a run per trial."""
    search_id = create_search(engine, space.kind, BASE, space.to_dict())
    study = optuna.create_study(study_name=get_search(engine, search_id).study_name, storage=study_storage(url),
                                directions=list(space.directions))
    for params, state_name, values, run_epochs in trials:
        study.enqueue_trial(params)
        trial = study.ask()
        for param in space.params:
            suggest(trial, param)
        run_id = store.create_run(engine, {**BASE, **trial.params}, search_trial=(search_id, trial.number),
                                  status="completed" if state_name == "COMPLETE" else "pruned")
        trial.set_user_attr("run_id", run_id)
        for epoch in run_epochs:
            store.log_epoch(engine, run_id, epoch)
            if len(values) < 2:
                trial.report(epoch["val_acc"], epoch["epoch"])
        study.tell(trial, list(values) if state_name == "COMPLETE" else None,
                   state=optuna.trial.TrialState[state_name])
    claim_driver(engine, search_id)  # as a driver leaves a search it has finished
    release_driver(engine, search_id, "finished")
    return search_id


@pytest.fixture
def search_db(engine, db_url, cpu_machine):  # noqa: F811
    yield engine, db_url
    forget_storages()


def epochs(*accuracies: float, images_per_s: float = 100.0) -> list[dict]:
    return [{"epoch": i, "val_acc": a, "images_per_s": images_per_s, "epoch_time_s": 1.0}
            for i, a in enumerate(accuracies, start=1)]


def a_finished_search(engine, url) -> int:
    space = SearchSpace(params=(parse_param("lr=1e-4:1e-1:log"), parse_param("batch_size=32,64")), trials=3,
                        pruner="median")
    return make_search(engine, url, space, [({"lr": 1e-3, "batch_size": 32}, "COMPLETE", (0.6,), epochs(0.5, 0.6)),
                                            ({"lr": 3e-3, "batch_size": 64}, "COMPLETE", (0.9,), epochs(0.8, 0.9)),
                                            ({"lr": 5e-2, "batch_size": 32}, "PRUNED", (), epochs(0.2))])


def test_the_search_page_shows_the_trials_the_answer_and_the_charts(search_db):
    engine, url = search_db
    search_id = a_finished_search(engine, url)
    at = open_page("pages/search.py", search=str(search_id))
    assert not at.exception, at.exception
    [table] = at.dataframe
    shown = table.value
    assert list(shown["state"]) == ["complete", "complete", "pruned"]
    assert list(shown["best validation accuracy"]) == ["60.00%", "90.00%", "—"]
    assert list(shown["epochs"]) == [2, 2, 1]
    assert [s.value for s in at.success] == ["Best: trial 1 (lr=0.003, batch_size=64), best validation accuracy "
                                             "90.00%."]
    assert any(c.value.startswith("parallax launch ") and "--model test_resnet" in c.value for c in at.code)
    assert len(at.get("plotly_chart")) == 3  # best so far, importance, parallel coordinates
    assert any(b.label == "Download the report (HTML)" for b in at.get("download_button"))


def test_launch_with_these_settings_fills_the_launch_form_with_the_best_trial(search_db):
    engine, url = search_db
    search_id = a_finished_search(engine, url)
    at = open_page("pages/search.py", search=str(search_id))
    best = trial_runs(engine, search_id)[1]["config"]
    at.button(key="launch_best").click().run()
    assert not at.exception, at.exception
    assert any(f"search #{search_id}'s best settings (trial 1)" in i.value for i in at.info)
    assert at.number_input(key="lr").value == pytest.approx(best["lr"])
    assert at.number_input(key="batch_size").value == best["batch_size"]


def test_two_objectives_give_a_pareto_front(search_db):
    engine, url = search_db
    space = SearchSpace(params=(parse_param("batch_size=32,64,128"),), objective="acc_and_speed", trials=3)
    search_id = make_search(engine, url, space, [({"batch_size": 32}, "COMPLETE", (0.9, 100.0), epochs(0.9)),
                                                 ({"batch_size": 64}, "COMPLETE", (0.8, 300.0), epochs(0.8)),
                                                 ({"batch_size": 128}, "COMPLETE", (0.7, 200.0), epochs(0.7))])
    at = open_page("pages/search.py", search=str(search_id))
    assert not at.exception, at.exception
    assert at.success[0].value.startswith("2 trial(s) on the Pareto front of accuracy and speed")
    pareto = at.get("plotly_chart")[0].proto.spec
    assert "Pareto front" in pareto


def test_a_search_whose_driver_is_gone_is_offered_for_resuming(search_db):
    engine, url = search_db
    search_id = a_finished_search(engine, url)
    from sqlalchemy import update

    from db.connection import session_scope
    from db.tables import Search

    with session_scope(engine) as session:  # its driver was killed: the row still names it
        session.execute(update(Search).where(Search.id == search_id).values(status="running", driver_pid=2**22 + 1,
                                                                             driver_host=socket.gethostname()))
    at = open_page("pages/search.py", search=str(search_id))
    assert any("is not running here" in w.value for w in at.warning)
    assert at.button(key="resume_search").label == "Resume the search"


def test_an_unknown_search_in_the_address_is_said_and_nothing_else_shown(search_db):
    engine, url = search_db
    a_finished_search(engine, url)
    at = open_page("pages/search.py", search="9")
    assert [e.value for e in at.error] == ["Search #9 in the address does not exist (it may have been deleted): "
                                           "nothing of it is shown."]
    assert not at.dataframe


def test_launch_in_search_mode_checks_each_value_and_starts_a_search(search_db, parallax_home):
    engine, url = search_db
    at = open_page("pages/launch.py")
    at.radio(key="launch_mode").set_value("Search").run()
    at.selectbox(key="model").set_value("test_resnet")
    at.number_input(key="epochs").set_value(1)
    at.multiselect(key="search_fields_hyper").set_value(["lr", "batch_size"]).run()
    at.text_input(key="search_param_batch_size").set_value("batch_size=0,64").run()
    assert not at.exception, at.exception
    assert any("batch_size 0 is not allowed: use a whole number from 1 to 65536" in e.value for e in at.error)
    button = next(b for b in at.button if b.label.startswith("Launch the search"))
    assert button.disabled
    at.text_input(key="search_param_batch_size").set_value("batch_size=32,64").run()
    at.number_input(key="search_trials").set_value(2).run()
    button = next(b for b in at.button if b.label.startswith("Launch the search"))
    assert button.label == "Launch the search (2 trials)" and not button.disabled
    button.click().run()
    assert not at.exception, at.exception
    [search] = list_searches(engine)
    assert SearchSpace.from_dict(search.space).names == ("lr", "batch_size")
    try:  # its driver, a process of its own, records itself and launches the first trial
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not trial_runs(engine, search.id):
            time.sleep(0.5)
        assert trial_runs(engine, search.id), "the search's driver launched no trial"
        assert get_search(engine, search.id).driven_here_by_a_live_process
    finally:
        stop_search(search.id)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and get_search(engine, search.id).driven_here_by_a_live_process:
            time.sleep(0.5)
        for run in trial_runs(engine, search.id).values():
            assert store.get_run(engine, run["id"]).status not in state.ACTIVE_STATUSES

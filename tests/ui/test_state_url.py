"""State in the address: the Compare page's runs (?runs=3,5,8) and the Runs page's filters
(?status=failed&model=resnet18) can be bookmarked and sent; what in them names nothing here gets a
message and is left out, never replaced by another run.

    .venv/bin/python -m pytest tests/ui/test_state_url.py -q
"""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.support import ROOT
from db import store

APP = str(ROOT / "app.py")
TIMEOUT_S = 90  # the first page in a process imports torch and timm


def add_run(engine, *, status="completed", **changes) -> int:
    config = {"dataset": "digits", "model": "test_resnet", "strategy": "single", "devices": ["cpu"],
              "batch_size": 128, "image_size": 32, "epochs": 1, "tags": [], **changes}
    run_id = store.create_run(engine, config, status=status)
    store.log_epoch(engine, run_id, {"epoch": 1, "train_loss": 1.0, "val_loss": 1.0, "train_acc": 0.5,
                                     "val_acc": 0.5, "epoch_time_s": 2.0, "train_time_s": 1.8, "images_per_s": 100.0})
    return run_id


def open_page(page: str, **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    for key, value in query.items():
        at.query_params[key] = value
    return at.switch_page(page).run()


def test_compare_takes_its_runs_from_the_address_and_keeps_them_there(parallax_home, engine):
    first, second, third = add_run(engine), add_run(engine, strategy="ddp", devices=["cpu", "cpu"]), add_run(engine)
    at = open_page("pages/compare.py", runs=f"{second},{first}")
    assert not at.exception and not at.error
    assert at.multiselect(key="compare_picker").value == [second, first]
    at.multiselect(key="compare_picker").select(third).run()
    assert at.query_params["runs"] == f"{second},{first},{third}"
    at.multiselect(key="compare_picker").set_value([]).run()
    assert "runs" not in at.query_params


def test_a_bad_or_unknown_run_in_the_address_gets_a_message_and_no_other_run(parallax_home, engine):
    kept = add_run(engine)
    other = add_run(engine)  # never shown in its place
    at = open_page("pages/compare.py", runs=f"abc,{kept},999,{kept}")
    assert not at.exception
    assert [e.value for e in at.error] == [
        "'abc' in ?runs= in the address is not a run number: each must be a whole number from 1 to "
        f"{store.MAX_ID}, e.g. ?runs=3,5,8.",
        "Run #999 in the address does not exist (it may have been deleted): it is left out."]
    assert at.multiselect(key="compare_picker").value == [kept]
    assert other not in at.multiselect(key="compare_picker").value
    assert at.query_params["runs"] == str(kept)  # the address now says what is shown


def test_runs_filters_come_from_the_address_and_go_back_into_it(parallax_home, engine):
    failed = add_run(engine, status="failed", model="resnet18")
    add_run(engine, model="resnet18")
    add_run(engine, status="failed")
    at = open_page("pages/runs.py", status="failed", model="resnet18,no_such_model")
    assert not at.exception
    assert at.multiselect(key="filter_statuses").value == ["failed"]
    assert at.multiselect(key="filter_models").value == ["resnet18"]
    assert [w.value for w in at.warning] == ["No run has model 'no_such_model' (from ?model= in the address): "
                                             "that filter value is left out."]
    assert at.dataframe[0].value["run"].tolist() == [failed]
    assert at.query_params["model"] == "resnet18"
    at.multiselect(key="filter_statuses").select("completed").run()
    assert at.query_params["status"] == "failed,completed"
    assert sorted(at.dataframe[0].value["run"].tolist()) == [failed, failed + 1]

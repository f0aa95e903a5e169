"""The Launch form remembers, through AppTest: the last launch's values stay in the form for the
browser session, a Run page's "Launch again with these settings" loads that run's config into the
form to edit, and a sweep starts with the strategies the chosen devices allow.

    .venv/bin/python -m pytest tests/pages/test_launch_memory.py -q
"""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.nvml_machines import cpu_machine, fake_nvml  # noqa: F401
from tests.support import ROOT
from db import store
from db.run_state import ACTIVE_STATUSES
from trainer_backend.control.lifecycle import cancel

APP = str(ROOT / "app.py")
TIMEOUT_S = 90  # the first page in a process imports torch and timm


def open_page(page: str, **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.switch_page(page)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def test_after_a_launch_the_form_keeps_the_launched_values(engine, db_url, parallax_home, cpu_machine):  # noqa: F811
    at = open_page("pages/launch.py")
    at.selectbox(key="model").set_value("test_resnet")
    at.radio(key="strategy").set_value("ddp").run()
    at.number_input(key="cpu_processes_ddp").set_value(3)
    at.number_input(key="image_size").set_value(16)
    at.number_input(key="batch_size").set_value(96)
    at.number_input(key="epochs").set_value(1)
    at.text_input(key="tags").set_value("small, ddp").run()
    assert not at.error, [e.value for e in at.error]
    try:
        next(b for b in at.button if b.label == "Launch").click().run()
        assert not at.exception, at.exception
        [run] = store.list_runs(engine)
        assert at.query_params["run"] == [str(run.id)] or at.query_params["run"] == str(run.id)  # the Run page

        at.switch_page("pages/launch.py").run()  # back to the form, as from the sidebar
        assert not at.exception, at.exception
        assert at.selectbox(key="model").value == "test_resnet"
        assert at.radio(key="strategy").value == "ddp"
        assert at.number_input(key="cpu_processes_ddp").value == 3
        assert at.number_input(key="image_size").value == 16
        assert at.number_input(key="batch_size").value == 96
        assert at.number_input(key="epochs").value == 1
        assert at.text_input(key="tags").value == "small, ddp"
    finally:
        for run in store.list_runs(engine):
            if run.status in ACTIVE_STATUSES:
                cancel(run.id, db_url=db_url)


def test_launch_again_loads_the_runs_settings_into_the_form(engine, parallax_home, cpu_machine):  # noqa: F811
    run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "pp",
                                       "devices": ["cpu"] * 3, "batch_size": 96, "image_size": 24, "epochs": 2,
                                       "lr": 0.01, "optimizer": "sgd", "microbatches": 6, "augment": "flip",
                                       "tags": ["again"]}, status="completed")
    at = open_page("pages/run.py", run=str(run_id))
    assert not at.exception, at.exception
    at.button(key="launch_again").click().run()
    assert not at.exception, at.exception
    assert at.radio(key="launch_mode").value == "One run"
    assert any(f"run #{run_id}'s settings" in i.value for i in at.info)
    assert at.radio(key="strategy").value == "pp"
    assert at.number_input(key="cpu_processes_pp").value == 3
    assert at.number_input(key="batch_size").value == 96
    assert at.number_input(key="image_size").value == 24
    assert at.number_input(key="epochs").value == 2
    assert at.number_input(key="lr").value == 0.01
    assert at.selectbox(key="optimizer").value == "sgd"
    assert at.number_input(key="microbatches").value == 6
    assert at.multiselect(key="augment").value == ["flip"]
    assert at.text_input(key="tags").value == "again"
    assert not at.error, [e.value for e in at.error]  # a launchable form: nothing starts until Launch


def test_a_sweep_starts_with_the_strategies_the_devices_allow(parallax_home, cpu_machine):  # noqa: F811
    at = open_page("pages/launch.py")
    at.radio(key="launch_mode").set_value("Compare strategies").run()
    assert at.multiselect(key="sweep_strategies").value == ["single", "ddp", "mp", "pp"]  # 2 CPU processes
    at.number_input(key="cpu_processes_sweep").set_value(1).run()
    assert at.multiselect(key="sweep_strategies").value == ["single"]  # one device: nothing else can run
    at.text_input(key="sweep_device_counts").set_value("1,2").run()
    assert at.multiselect(key="sweep_strategies").value == ["single", "ddp", "mp", "pp"]  # runs at 2 devices too

    at.multiselect(key="sweep_strategies").set_value(["single", "ddp"]).run()  # the user's own choice stays
    at.text_input(key="sweep_device_counts").set_value("").run()
    at.number_input(key="cpu_processes_sweep").set_value(3).run()
    assert at.multiselect(key="sweep_strategies").value == ["single", "ddp"]

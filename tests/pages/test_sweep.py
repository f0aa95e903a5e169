"""Strategy sweeps through AppTest: the Launch page's "Compare strategies" mode (each strategy's
config checked, a real launch that records a sweep) and the Sweep page's report on a sweep built
directly in the database.

    .venv/bin/python -m pytest tests/pages/test_sweep.py -q
"""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.support import ROOT
from tests.nvml_machines import cpu_machine, fake_nvml  # noqa: F401
from db import store
from db.run_state import ACTIVE_STATUSES
from reports.scaling_forecast import HYPOTHETICAL_HEADING
from contract import devices
from trainer_backend.control.lifecycle import cancel

APP = str(ROOT / "app.py")
TIMEOUT_S = 90  # the first page in a process imports torch and timm


def open_page(page: str, **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.switch_page(page)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def sweep_button(at: AppTest):
    return next(b for b in at.button if b.label.startswith("Launch the sweep"))


def test_launch_in_compare_mode_checks_every_strategy_and_starts_a_sweep(engine, db_url, parallax_home,
                                                                        cpu_machine):  # noqa: F811
    at = open_page("pages/launch.py")
    at.radio(key="launch_mode").set_value("Compare strategies").run()
    assert at.multiselect(key="sweep_strategies").value == ["single", "ddp", "mp", "pp"]
    at.selectbox(key="model").set_value("test_resnet")
    at.number_input(key="epochs").set_value(1)
    at.number_input(key="batch_size").set_value(5).run()  # 5 images cannot be split over 2 ddp processes
    assert not at.exception, at.exception
    messages = [e.value for e in at.error]
    assert any(m.startswith("With ddp: batch_size 5") for m in messages), messages
    assert sweep_button(at).disabled

    at.number_input(key="batch_size").set_value(64).run()
    assert not at.error, [e.value for e in at.error]
    assert sweep_button(at).label == "Launch the sweep (4 runs)"
    try:
        sweep_button(at).click().run()
        assert not at.exception, at.exception
        sweeps = store.list_sweeps(engine)
        assert [s["strategies"] for s in sweeps] == [["single", "ddp", "mp", "pp"]]
        run_ids = store.sweep_run_ids(engine, sweeps[0]["id"])
        assert [store.get_run(engine, i).strategy for i in run_ids] == ["single", "ddp", "mp", "pp"]
        assert [store.get_run(engine, i).config["devices"] for i in run_ids] == [["cpu"], *[["cpu", "cpu"]] * 3]
    finally:
        for run in store.list_runs(engine):
            if run.status in ACTIVE_STATUSES:
                cancel(run.id, db_url=db_url)


def add_sweep_run(engine, sweep_id: int | None, strategy: str, images_per_s: float, status: str = "completed",
                  n_devices: int = 2, epochs: int = 2, **config) -> int:
    devices = ["cpu"] if strategy == "single" else ["cpu"] * n_devices
    run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": strategy,
                                       "devices": devices, "batch_size": 64, "image_size": 32, "amp": "auto",
                                       "epochs": 2, **config}, status=status, sweep_id=sweep_id)
    for epoch in range(1, epochs + 1):
        store.log_epoch(engine, run_id, {"epoch": epoch, "train_loss": 1.0, "val_loss": 1.0, "train_acc": 0.5,
                                         "val_acc": 0.5 * epoch, "epoch_time_s": 2.0, "train_time_s": 1.8,
                                         "images_per_s": images_per_s,
                                         "peak_memory_mb": {f"rank{r}:cpu": 500.0 for r in range(len(devices))}})
    return run_id


def test_sweep_page_shows_the_report_and_advice(engine, parallax_home):
    config = {"dataset": "digits", "model": "test_resnet", "devices": ["cpu", "cpu"], "batch_size": 64}
    sweep_id = store.create_sweep(engine, config, ["single", "ddp", "mp"])
    single_id = add_sweep_run(engine, sweep_id, "single", 100.0)
    ddp_id = add_sweep_run(engine, sweep_id, "ddp", 180.0)
    add_sweep_run(engine, sweep_id, "mp", 90.0)

    at = open_page("pages/sweep.py", sweep=str(sweep_id))
    assert not at.exception, at.exception
    assert at.selectbox(key="sweep_picker").value == sweep_id
    advice = at.success[0].value
    assert "DDP on 2 devices: 1.80x, 90% efficient" in advice and "Fastest: DDP" in advice
    table = at.table[0].value
    assert list(table["strategy"]) == ["single", "ddp", "mp"]
    assert list(table["speedup (×)"]) == ["1.00×", "1.80×", "0.90×"]
    assert list(table["efficiency"]) == ["100%", "90%", "45%"]
    assert table["time to 90% val acc"].tolist() == ["4.0 s"] * 3  # reached in epoch 2, after 2 × 2.0 s
    links = [link.proto.label for link in at.get("page_link")]
    assert f"Run #{single_id} · single on 1 device(s)" in links and f"Run #{ddp_id} · ddp on 2 device(s)" in links
    assert [b.proto.label for b in at.get("download_button")] == ["Download the report (HTML)"]
    assert len(at.get("plotly_chart")) == 1  # the speedup chart; no breakdown: nothing was profiled


def test_sweep_page_shows_a_later_sweeps_measurement_against_the_forecast(engine, parallax_home, monkeypatch):
    monkeypatch.setattr(devices, "cpu_cores", lambda: 2)  # the machine: 2 cores, whatever this one has
    sweep_id = store.create_sweep(engine, {"devices": ["cpu", "cpu"]}, ["single", "ddp"])
    add_sweep_run(engine, sweep_id, "single", 100.0)
    add_sweep_run(engine, sweep_id, "ddp", 160.0)
    later_id = store.create_sweep(engine, {"devices": ["cpu"] * 4}, ["ddp"])
    measured = add_sweep_run(engine, later_id, "ddp", 250.0, n_devices=4)

    at = open_page("pages/sweep.py", sweep=str(sweep_id))
    assert not at.exception, at.exception
    forecast = at.table[1].value.reset_index().set_index("devices")
    # Measured at 4 (in a later sweep): shown, although this machine has 2 cores.
    assert list(forecast.index) == [4] and forecast.loc[4, "measured in"] == f"sweep #{later_id}, run #{measured}"
    assert forecast.loc[4, "images/s measured"] == "250"
    assert any("Measured in “sweep #N, run #M”: a later sweep's" in c.value for c in at.caption)
    # 8 processes on 2 cores: set apart under a warning, the reason in its row, its measured cells blank.
    assert [w.value for w in at.warning] == [f"{HYPOTHETICAL_HEADING}: what the model gives, not what this machine "
                                             "can measure."]
    beyond = at.table[2].value.reset_index().set_index("devices")
    assert list(beyond.index) == [8]
    assert beyond.loc[8, "why hypothetical"].startswith("this machine has 2 CPU cores: 8 processes would share them")
    assert beyond.loc[8, ["images/s measured", "error", "speedup measured", "measured in"]].tolist() == [""] * 4


def test_sweep_page_says_how_to_start_a_sweep_when_there_is_none(parallax_home):
    at = open_page("pages/sweep.py")
    assert not at.exception, at.exception
    assert "No sweeps yet" in at.info[0].value and "Compare strategies" in at.info[0].value


def test_compare_page_gives_the_advice_when_the_runs_hold_a_single_baseline(engine, parallax_home):
    single_id = add_sweep_run(engine, None, "single", 100.0)
    ddp_id = add_sweep_run(engine, None, "ddp", 150.0)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.session_state["compare_ids"] = [ddp_id, single_id]
    at.switch_page("pages/compare.py").run()
    assert not at.exception, at.exception
    assert [s.value for s in at.success] == ["DDP on 2 devices: 1.50x, 75% efficient. Fastest: DDP."]

    at.multiselect(key="compare_picker").set_value([ddp_id]).run()  # no single run picked: no verdict
    assert not at.success


def test_sweep_page_names_no_verdict_until_every_run_has_finished(engine, parallax_home):
    config = {"dataset": "digits", "model": "test_resnet", "devices": ["cpu", "cpu"], "batch_size": 64,
              "profile": True}
    sweep_id = store.create_sweep(engine, config, ["single", "ddp"])
    single_id = add_sweep_run(engine, sweep_id, "single", 100.0, profile=True)
    # In its second epoch: only its first (start-up) epoch is measured.
    ddp_id = add_sweep_run(engine, sweep_id, "ddp", 80.0, status="running", epochs=1, profile=True)

    at = open_page("pages/sweep.py", sweep=str(sweep_id))
    assert not at.exception, at.exception
    assert not at.success  # no "Fastest: SINGLE" while ddp has only its start-up epoch
    [waiting] = [i.value for i in at.info if i.value.startswith("Waiting for")]
    assert f"#{ddp_id} ddp×2 test_resnet (running)" in waiting and f"#{single_id}" not in waiting
    table = at.table[0].value
    assert table["speedup (×)"].tolist() == ["1.00×", "—"] and table["efficiency"].tolist() == ["100%", "—"]
    captions = [c.value for c in at.caption]
    assert not any("Profile the first steps" in c for c in captions)  # it is on: the page says what it waits for
    assert any(c.startswith("The sweep is profiled: the step breakdown appears") for c in captions)
    assert any(c.startswith(f"Waiting for #{ddp_id} ddp×2 test_resnet (running) to finish: the forecast")
               for c in captions)
    assert len(at.table) == 1  # no forecast table

    store.log_epoch(engine, ddp_id, {"epoch": 2, "images_per_s": 180.0, "epoch_time_s": 2.0, "train_time_s": 1.8,
                                     "val_acc": 0.9, "peak_memory_mb": {"rank0:cpu": 500.0, "rank1:cpu": 500.0}})
    store.set_status(engine, ddp_id, "completed")
    at.run()
    assert not at.exception, at.exception
    assert "Fastest: DDP" in at.success[0].value and not [i for i in at.info if i.value.startswith("Waiting")]
    assert at.table[0].value["speedup (×)"].tolist() == ["1.00×", "1.80×"]
    assert len(at.table) == 2  # the forecast, now that its runs have finished

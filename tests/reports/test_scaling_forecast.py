"""The scaling forecast: its arithmetic on synthetic numbers, the sweep report (checked against its own
runs and later sweeps' runs) on runs written by hand into a real SQLite database, and
``--device-counts`` (parsing, what each strategy runs, refusals before anything is recorded).

    .venv/bin/python -m pytest tests/reports/test_scaling_forecast.py -q
"""

from __future__ import annotations

import pytest

import db
from tests.support import run_cli
from db import store
from reports.scaling_forecast import (
    HYPOTHETICAL_HEADING,
    CommModel,
    Machine,
    bubble_fraction,
    fit_comm,
    format_forecast,
    pipeline_step_s,
    ring_volume,
    sweep_forecast,
)
from reports.sweep_report import format_table, mfu_note, sweep_html, sweep_table
from contract.config import ConfigError, RunConfig
from trainer_backend.control.lifecycle import parse_device_counts, sweep_configs

BATCH = 64


def add_run(engine, sweep_id, strategy: str, devices: int, images_per_s: float, *, comm_share: float | None = None,
            breakdown: dict | None = None, mfu: float | None = None, microbatches: int = 4,
            status: str = "completed", device: str = "cpu", **config_changes) -> int:
    """A run of two epochs; with ``comm_share``, each rank waited that share of its training time in
    collectives; with ``breakdown``, every device holds those MB; ``config_changes`` replace config fields."""
    config = {"dataset": "digits", "model": "resnet18", "strategy": strategy, "devices": [device] * devices,
              "batch_size": BATCH, "image_size": 32, "amp": "auto", "epochs": 2, "microbatches": microbatches,
              **config_changes}
    run_id = store.create_run(engine, config, status=status, sweep_id=sweep_id)
    for epoch in (1, 2):
        extra = {}
        if comm_share is not None:
            extra["ranks"] = [{"rank": r, "train_time_s": 5.0, "data_time_s": 0.5, "compute_time_s": 5.0 * (1 - comm_share) - 0.5,
                               "comm_wait_s": 5.0 * comm_share} for r in range(devices)]
        if breakdown is not None:
            extra["memory_breakdown"] = {f"rank{r}:cpu": breakdown for r in range(devices)}
        if mfu is not None:
            extra |= {"mfu": mfu, "achieved_tflops": 0.05}
        # The first epoch carries start-up costs and is left out of every figure: make it slow.
        store.log_epoch(engine, run_id, {"epoch": epoch, "train_loss": 1.0, "val_loss": 1.0, "train_acc": 0.5,
                                         "val_acc": 0.5, "epoch_time_s": 6.0, "train_time_s": 5.0,
                                         "images_per_s": images_per_s / (3 if epoch == 1 else 1),
                                         "peak_memory_mb": {f"rank{r}:cpu": 400.0 for r in range(devices)},
                                         "extra": extra})
    return run_id


def ddp_parts(share: int = 1) -> dict:
    """resnet18 with Adam: 42.7 MB of parameters, as many of gradients, twice that of optimizer state."""
    return {"parameters_mb": 42.7 / share, "gradients_mb": 42.7 / share, "optimizer_mb": 85.4 / share,
            "activations_other_mb": 100.0}


# --- the model's arithmetic ------------------------------------------------------------------


def test_ring_all_reduce_volume_and_the_pipeline_bubble():
    assert ring_volume("ddp", 1) == 0.0
    assert ring_volume("ddp", 2) == pytest.approx(1.0)  # 2 (n-1)/n
    assert ring_volume("ddp", 8) == pytest.approx(1.75)
    assert ring_volume("fsdp", 4) == pytest.approx(2.25)  # 3 (n-1)/n
    assert bubble_fraction(1, 8) == 0.0
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction(2, 2) == pytest.approx(1 / 3)
    # A step is the ideal share t1/p stretched by 1/(1 - bubble).
    assert pipeline_step_s(1.0, 4, 8) == pytest.approx(0.25 / (1 - 3 / 11))
    assert pipeline_step_s(1.0, 4, 1) == pytest.approx(1.0)  # one microbatch: stages run one after another


def test_comm_fit_puts_one_point_on_bandwidth_and_separates_latency_with_two():
    one = fit_comm("ddp", [(2, 0.04)])
    assert one == CommModel(latency_s=0.0, pass_s=pytest.approx(0.04))
    assert one.time_s("ddp", 4) == pytest.approx(0.06) and one.time_s("ddp", 1) == 0.0
    truth = CommModel(latency_s=0.002, pass_s=0.03)
    fitted = fit_comm("ddp", [(n, truth.time_s("ddp", n)) for n in (2, 4, 8)])
    assert fitted.latency_s == pytest.approx(0.002) and fitted.pass_s == pytest.approx(0.03)
    # A negative latency is not physical: the fit falls back to bandwidth alone.
    assert fit_comm("ddp", [(2, 0.05), (4, 0.05)]).latency_s == 0.0


# --- the report on runs written by hand ------------------------------------------------------


def test_single_and_ddp_on_two_devices_forecast_four_and_eight(engine):
    sweep_id = store.create_sweep(engine, {"devices": ["cpu", "cpu"]}, ["single", "ddp"])
    add_run(engine, sweep_id, "single", 1, 100.0)              # t1 = 64 / 100 = 0.64 s per step
    add_run(engine, sweep_id, "ddp", 2, 160.0, comm_share=0.1, breakdown=ddp_parts())  # 0.4 s, 0.04 s of it waiting
    forecast = sweep_forecast(engine, sweep_id)
    rows = forecast.table.set_index("devices")
    assert list(rows.index) == [4, 8] and set(forecast.table["kind"]) == {"forecast"}
    # compute per device at 2: (0.4 - 0.04) / 0.32 = 1.125 x the ideal share; comm pass 0.04 s.
    # 4: 1.125 x 0.16 + 0.04 x 1.5 = 0.24 s; 8: 1.125 x 0.08 + 0.04 x 1.75 = 0.16 s.
    assert rows.loc[4, "images_per_s_predicted"] == pytest.approx(BATCH / 0.24)
    assert rows.loc[8, "images_per_s_predicted"] == pytest.approx(400.0)
    assert rows.loc[8, "speedup_predicted"] == pytest.approx(4.0)
    # DDP keeps whole parameters, gradients and optimizer state; activations follow the per-device batch.
    assert rows.loc[4, "memory_mb_predicted"] == pytest.approx(170.8 + 50.0)
    assert rows.loc[4, "error"] != rows.loc[4, "error"]  # NaN: nothing measured at 4
    text = format_forecast(forecast)
    assert "Scaling forecast" in text and "comm wait per rank" in text and "(p−1)/(m+p−1)" in text


def test_the_dataset_and_workspaces_a_gpu_keeps_whole_are_not_scaled_with_the_per_device_batch(engine):
    """40 MB of the 100 MB "activations and other" are the dataset each rank keeps on its GPU and its cuBLAS
    workspaces (the run's stored estimate says so): at 4 devices only the other 60 MB halve."""
    sweep_id = store.create_sweep(engine, {"devices": ["cpu", "cpu"]}, ["single", "ddp"])
    add_run(engine, sweep_id, "single", 1, 100.0)
    ddp = add_run(engine, sweep_id, "ddp", 2, 160.0, comm_share=0.1, breakdown=ddp_parts())
    store.set_measurements(engine, ddp, {"memory_estimate": {"devices": {
        f"rank{r}:cpu": {"data_mb": 24.0, "workspace_mb": 16.0, "total_mb": 300.0} for r in range(2)}}})
    rows = sweep_forecast(engine, sweep_id).table.set_index("devices")
    assert rows.loc[4, "memory_mb_predicted"] == pytest.approx(170.8 + 60.0 / 2 + 40.0)
    assert rows.loc[8, "memory_mb_predicted"] == pytest.approx(170.8 + 60.0 / 4 + 40.0)


def test_a_dataset_measured_as_its_own_part_is_kept_whole_too(engine):
    """The same run, recorded with the dataset apart from the rest (data_mb 24, the rest 76): the same forecast."""
    sweep_id = store.create_sweep(engine, {"devices": ["cpu", "cpu"]}, ["single", "ddp"])
    add_run(engine, sweep_id, "single", 1, 100.0)
    ddp = add_run(engine, sweep_id, "ddp", 2, 160.0, comm_share=0.1,
                  breakdown=ddp_parts() | {"data_mb": 24.0, "activations_other_mb": 76.0})
    store.set_measurements(engine, ddp, {"memory_estimate": {"devices": {
        f"rank{r}:cpu": {"data_mb": 24.0, "workspace_mb": 16.0, "total_mb": 300.0} for r in range(2)}}})
    rows = sweep_forecast(engine, sweep_id).table.set_index("devices")
    assert rows.loc[4, "memory_mb_predicted"] == pytest.approx(170.8 + 60.0 / 2 + 40.0)
    assert rows.loc[8, "memory_mb_predicted"] == pytest.approx(170.8 + 60.0 / 4 + 40.0)


def test_a_measured_count_is_shown_against_its_forecast_with_the_error(engine):
    sweep_id = store.create_sweep(engine, {"devices": ["cpu"]}, ["single", "ddp", "ddp", "fsdp", "pp"])
    add_run(engine, sweep_id, "single", 1, 100.0)
    add_run(engine, sweep_id, "ddp", 2, 160.0, comm_share=0.1, breakdown=ddp_parts())
    measured = add_run(engine, sweep_id, "ddp", 4, 250.0, comm_share=0.2, breakdown=ddp_parts() | {"activations_other_mb": 60.0})
    add_run(engine, sweep_id, "fsdp", 2, 128.0, breakdown=ddp_parts(share=2))
    add_run(engine, sweep_id, "pp", 2, 160.0, microbatches=4)  # exactly the bubble-stretched ideal share
    table = sweep_forecast(engine, sweep_id).table
    ddp = table[table["strategy"] == "ddp"].set_index("devices")
    assert list(ddp.index) == [4, 8, 16]  # the measured 4, then 2x and 4x the largest count measured
    at4 = ddp.loc[4]
    assert at4["kind"] == "predicted vs measured" and at4["run_id"] == measured
    assert at4["images_per_s_measured"] == pytest.approx(250.0)
    assert at4["error"] == pytest.approx((BATCH / 0.24) / 250.0 - 1)
    assert at4["speedup_measured"] == pytest.approx(2.5)
    assert at4["memory_error"] == pytest.approx(220.8 / 230.8 - 1)
    # FSDP with no comm measured: all of the step above one device's half is comm (0.5 - 0.32 = 0.18 s);
    # at 4: 0.16 + 0.18 x 2.25 / 1.5; memory: everything split 4 ways instead of 2.
    fsdp = table[table["strategy"] == "fsdp"].set_index("devices")
    assert fsdp.loc[4, "images_per_s_predicted"] == pytest.approx(BATCH / (0.16 + 0.27))
    assert fsdp.loc[4, "memory_mb_predicted"] == pytest.approx((21.35 + 21.35 + 42.7) / 2 + 50.0)
    # PP with 4 microbatches: at 4 stages, t1 (m + p - 1) / (m p) = 0.64 x 7 / 16.
    pp = table[table["strategy"] == "pp"].set_index("devices")
    assert pp.loc[4, "images_per_s_predicted"] == pytest.approx(BATCH / (0.64 * 7 / 16))


def single_and_ddp_on_two(engine) -> int:
    """A sweep whose DDP forecast at 4 devices is 64 / 0.24 images/s (as in the test above)."""
    sweep_id = store.create_sweep(engine, {"devices": ["cpu", "cpu"]}, ["single", "ddp"])
    add_run(engine, sweep_id, "single", 1, 100.0)
    add_run(engine, sweep_id, "ddp", 2, 160.0, comm_share=0.1, breakdown=ddp_parts())
    return sweep_id


def later_sweep(engine, strategy: str = "ddp", devices: int = 4) -> int:
    return store.create_sweep(engine, {"devices": ["cpu"] * devices}, [strategy])


def test_a_later_sweep_of_the_same_work_measures_the_forecast_count(engine):
    sweep_id = single_and_ddp_on_two(engine)
    add_run(engine, later_sweep(engine), "ddp", 4, 200.0)
    newer = later_sweep(engine)
    measured = add_run(engine, newer, "ddp", 4, 250.0, breakdown=ddp_parts() | {"activations_other_mb": 60.0})
    # Fields that do not change a step (tags, seed, epochs, learning rate) do not make it other work.
    also_same = add_run(engine, later_sweep(engine, devices=8), "ddp", 8, 380.0, tags=["again"], seed=3, epochs=5,
                        lr=0.1)
    forecast = sweep_forecast(engine, sweep_id)
    rows = forecast.table.set_index("devices")
    at4 = rows.loc[4]
    assert at4["kind"] == "predicted vs measured"
    assert at4["measured_in"] == f"sweep #{newer}, run #{measured}" and at4["run_id"] == measured  # the newest
    assert at4["images_per_s_measured"] == pytest.approx(250.0)
    assert at4["error"] == pytest.approx((BATCH / 0.24) / 250.0 - 1)
    assert at4["speedup_measured"] == pytest.approx(2.5)  # over this sweep's single run, as predicted
    assert at4["memory_mb_measured"] == pytest.approx(230.8)
    assert at4["memory_error"] == pytest.approx(220.8 / 230.8 - 1)
    assert rows.loc[8, "images_per_s_measured"] == pytest.approx(380.0) and rows.loc[8, "run_id"] == also_same
    assert any(line.startswith("Measured in “sweep #N, run #M”: a later sweep's") and "channels last" in line
               for line in forecast.assumptions)


def test_other_work_unfinished_runs_and_earlier_sweeps_do_not_measure_the_forecast(engine):
    earlier = later_sweep(engine)  # created before the sweep forecast
    add_run(engine, earlier, "ddp", 4, 240.0)
    sweep_id = single_and_ddp_on_two(engine)
    for changed in ({"model": "resnet50"}, {"batch_size": 2 * BATCH}, {"dataset": "eurosat"}, {"amp": "bf16"},
                    {"channels_last": True}, {"compile": True}, {"optimizer": "sgd"},
                    {"device": "cuda:0"}):
        add_run(engine, later_sweep(engine), "ddp", 4, 999.0, **changed)
    add_run(engine, later_sweep(engine), "ddp", 4, 999.0, status="running")
    add_run(engine, None, "ddp", 4, 999.0)  # in no sweep
    table = sweep_forecast(engine, sweep_id).table
    assert table["images_per_s_measured"].isna().all() and table["measured_in"].isna().all()
    assert set(table["kind"]) == {"forecast"}


def test_the_sweeps_own_measurement_wins_over_a_later_sweeps(engine):
    sweep_id = store.create_sweep(engine, {"devices": ["cpu"]}, ["single", "ddp", "ddp"])
    add_run(engine, sweep_id, "single", 1, 100.0)
    add_run(engine, sweep_id, "ddp", 2, 160.0, comm_share=0.1)
    own = add_run(engine, sweep_id, "ddp", 4, 250.0)
    add_run(engine, later_sweep(engine), "ddp", 4, 300.0)
    rows = sweep_forecast(engine, sweep_id).table.set_index("devices")
    assert rows.loc[4, "measured_in"] == f"run #{own}" and rows.loc[4, "images_per_s_measured"] == pytest.approx(250.0)


def test_later_sweeps_cost_the_same_few_queries_however_many_runs_they_hold(engine):
    from sqlalchemy import event

    sweep_id = single_and_ddp_on_two(engine)
    statements = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))

    def queries() -> int:
        statements.clear()
        sweep_forecast(engine, sweep_id)
        return len(statements)

    add_run(engine, later_sweep(engine), "ddp", 4, 250.0)
    one_later = queries()
    for devices in (4, 8, 16, 4, 8):
        add_run(engine, later_sweep(engine, devices=devices), "ddp", devices, 250.0)
    # the sweep, its run ids, runs, epochs and profile; the later runs and their epochs
    assert queries() == one_later <= 7, statements


def test_the_terminal_and_html_reports_say_where_each_measurement_comes_from(engine):
    sweep_id = single_and_ddp_on_two(engine)
    newer = later_sweep(engine)
    measured = add_run(engine, newer, "ddp", 4, 250.0)
    lines = format_forecast(sweep_forecast(engine, sweep_id, Machine(cpu_cores=16))).splitlines()
    header = lines[1]
    assert header.split()[-2:] == ["measured", "in"]
    at4 = next(line for line in lines[2:] if line.split()[:2] == ["ddp", "4"])
    assert at4.endswith(f"sweep #{newer}, run #{measured}") and " 250 " in at4
    at8 = next(line for line in lines[2:] if line.split()[:2] == ["ddp", "8"])
    assert "sweep #" not in at8 and "-" not in at8  # nothing measured at 8: blank cells, not dashes
    assert f"sweep #{newer}, run #{measured}" in sweep_html(engine, sweep_id)


def test_sweep_report_shows_mfu_beside_images_and_the_forecast(engine):
    sweep_id = store.create_sweep(engine, {"devices": ["cpu", "cpu"]}, ["single", "ddp"])
    add_run(engine, sweep_id, "single", 1, 100.0, mfu=0.25)
    add_run(engine, sweep_id, "ddp", 2, 160.0)  # recorded no MFU
    table = sweep_table(engine, sweep_id)
    assert table["mfu"].tolist()[0] == pytest.approx(0.25)
    text = format_table(table)
    header, single_line = text.splitlines()[:2]
    assert header.split()[6:8] == ["images/s", "MFU"] and "25.0%" in single_line
    assert "MFU: not recorded" in mfu_note(table)
    page = sweep_html(engine, sweep_id)
    assert "Scaling forecast" in page and "Memory breakdown: not recorded" in page and "2(n−1)/n" in page


def test_a_strategy_without_a_multi_device_run_says_why_it_has_no_forecast(engine):
    sweep_id = store.create_sweep(engine, {"devices": ["cpu"]}, ["single", "ddp"])
    add_run(engine, sweep_id, "single", 1, 100.0)
    add_run(engine, sweep_id, "ddp", 1, 90.0)
    forecast = sweep_forecast(engine, sweep_id)
    assert forecast.table.empty
    assert forecast.notes == ["DDP: no forecast — it needs a completed run on 2 or more devices in the sweep."]


def test_a_straggler_is_a_rank_ten_percent_slower_than_the_median_two_epochs_running():
    import pandas as pd

    from reports.efficiency import stragglers

    def epochs(times_per_epoch):
        return pd.DataFrame([{"run_id": 1, "epoch": e, "rank": r, "train_time_s": t}
                             for e, times in enumerate(times_per_epoch, start=1) for r, t in enumerate(times)])

    assert stragglers(epochs([[5.0, 5.0, 5.5], [5.0, 5.0, 5.5]])) == [2]  # 10 % slower, twice
    assert stragglers(epochs([[5.0, 5.0, 5.5], [5.0, 5.0, 5.0], [5.0, 5.0, 5.5]])) == []  # not running
    assert stragglers(epochs([[5.0, 5.0, 5.4], [5.0, 5.0, 5.4]])) == []  # 8 % slower
    assert stragglers(epochs([[5.0, 5.0]]), recorded=[{"rank": 1}, 0]) == [0, 1]  # named by Parallax


# --- --device-counts -------------------------------------------------------------------------


def test_device_counts_parse_and_refuse_in_one_line():
    assert parse_device_counts("4,1,2,2") == (1, 2, 4)
    assert parse_device_counts(None) is None
    for bad in ("1,x", "0", "", "1,,2", "-2"):
        with pytest.raises(ConfigError, match=f"--device-counts '{bad}' is not allowed"):
            parse_device_counts(bad)


def test_device_counts_run_each_strategy_per_count_and_single_once(monkeypatch):
    monkeypatch.setenv("PARALLAX_MAX_CPU_PROCESSES", "8")
    base = RunConfig(strategy="single", devices=("cpu",), batch_size=64)
    configs = sweep_configs(base, ["single", "dp", "ddp", "pp"], (1, 2, 4))
    assert [(c.strategy, c.devices) for c in configs] == [
        ("single", ("cpu",)), ("dp", ("cpu",)),
        ("ddp", ("cpu",)), ("ddp", ("cpu",) * 2), ("ddp", ("cpu",) * 4),
        ("pp", ("cpu",) * 2), ("pp", ("cpu",) * 4),  # no pipeline on one device
    ]
    with pytest.raises(ConfigError, match="gives pp no count it can run"):
        sweep_configs(base, ["single", "pp"], (1,))
    monkeypatch.setenv("PARALLAX_MAX_CPU_PROCESSES", "2")
    with pytest.raises(ConfigError, match="--device-counts 4 is not allowed: this machine runs at most 2 CPU processes"):
        sweep_configs(base, ["ddp"], (1, 2, 4))


def test_device_counts_on_gpus_take_the_first_n_listed(monkeypatch):
    monkeypatch.setattr("contract.config.cuda_device_count", lambda: 2)  # no GPU here: fake the count
    base = RunConfig(strategy="mp", devices=("cuda:0", "cuda:1"), batch_size=64)
    assert [c.devices for c in sweep_configs(base, ["ddp"], (1, 2))] == [("cuda:0",), ("cuda:0", "cuda:1")]
    with pytest.raises(ConfigError, match="--device-counts 4 is not allowed for ddp: --devices lists 2 GPU"):
        sweep_configs(base, ["ddp"], (2, 4))


def test_cli_refuses_a_device_count_over_the_cpu_limit_before_recording_anything(parallax_home):
    result = run_cli("sweep", "--strategies", "single,ddp", "--device-counts", "1,2,64", home=parallax_home,
                     env_extra={"PARALLAX_MAX_CPU_PROCESSES": "4"}, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --device-counts 64 is not allowed: this machine runs at most 4 CPU processes per run "
        "(max_cpu_processes; PARALLAX_MAX_CPU_PROCESSES sets another limit): use counts up to 4"]
    assert not (parallax_home / "parallax.db").exists() or not store.list_sweeps(
        db.make_engine(f"sqlite:///{parallax_home / 'parallax.db'}"))


def test_counts_the_machine_cannot_give_are_forecast_apart_with_the_reason(engine):
    """On 2 CPU cores, 4 and 8 DDP processes would share them: hypothetical, said in the row. Of GPUs, the
    count of the kind the sweep ran on bounds it, whatever other GPUs the machine lists."""
    sweep_id = single_and_ddp_on_two(engine)
    on_two_cores = sweep_forecast(engine, sweep_id, Machine(cpu_cores=2))
    rows = on_two_cores.table.set_index("devices")
    assert rows.loc[4, "beyond_machine"] == ("this machine has 2 CPU cores: 4 processes would share them, and the "
                                             "forecast takes devices as independent")
    assert rows.loc[8, "beyond_machine"].startswith("this machine has 2 CPU cores: 8 processes")
    assert rows.loc[8, "speedup_predicted"] == pytest.approx(4.0)  # the model's figure, kept but set apart
    text = format_forecast(on_two_cores)
    assert text.splitlines()[1] == f"{HYPOTHETICAL_HEADING}:" and "why hypothetical" in text.splitlines()[2]
    assert sweep_forecast(engine, sweep_id, Machine(cpu_cores=8)).table["beyond_machine"].isna().all()

    gpus = store.create_sweep(engine, {"devices": ["cuda:0", "cuda:1"]}, ["single", "ddp"])
    add_run(engine, gpus, "single", 1, 100.0, device="cuda:0")
    add_run(engine, gpus, "ddp", 2, 160.0, comm_share=0.1, device="cuda:0")
    mixed = Machine(cpu_cores=64, gpus=("NVIDIA H100", "NVIDIA H100", "NVIDIA A100", "NVIDIA A100", "NVIDIA A100"))
    rows = sweep_forecast(engine, gpus, mixed).table.set_index("devices")
    assert rows.loc[4, "beyond_machine"] == "this machine lists 2 × NVIDIA H100: 4 would need 2 more of that kind"
    assert sweep_forecast(engine, gpus, Machine(64, ("NVIDIA H100",) * 8)).table["beyond_machine"].isna().all()

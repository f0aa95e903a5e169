"""The Launch form's Advanced expander through AppTest: the training recipe's fields start from
RunConfig's defaults, say what they do to the batch and the learning rate, show a bad value next
to its field, and reach the launched run's config (one run and a sweep).

    .venv/bin/python -m pytest tests/pages/test_launch_recipe.py -q
"""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from tests.support import ROOT
from db import store
from db.run_state import ACTIVE_STATUSES
from tests.nvml_machines import cpu_machine, fake_nvml  # noqa: F401
from contract.config import RunConfig
from trainer_backend.control.lifecycle import cancel

APP = str(ROOT / "app.py")
TIMEOUT_S = 90  # the first page in a process imports torch and timm
RECIPE_INPUTS = ("warmup_epochs", "label_smoothing", "grad_clip", "accumulate_steps")


@pytest.fixture
def launch_page(parallax_home, cpu_machine) -> AppTest:  # noqa: F811
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    return at.switch_page("pages/launch.py").run()


def texts(elements) -> list[str]:
    return [element.value for element in elements]


def advanced(at: AppTest):
    return next(e for e in at.expander if e.label == "Advanced")


def errors_in_column_of(at: AppTest, key: str) -> list[str]:
    """The errors shown in the innermost column that holds the widget ``key``."""
    columns = [c for c in at.columns if any(w.key == key for w in [*c.number_input, *c.selectbox, *c.checkbox])]
    # Shown through escape_markdown: "[0, 1)" arrives as "\\[0, 1)".
    return [text.replace("\\", "") for text in texts(min(columns, key=lambda c: len(list(c))).error)]


def launch_button(at: AppTest):
    return next(button for button in at.button if button.label == "Launch")


def test_the_advanced_expander_starts_from_the_engines_defaults(launch_page):
    at, defaults = launch_page, RunConfig()
    section = advanced(at)
    for name in RECIPE_INPUTS:
        assert section.number_input(key=name).value == getattr(defaults, name), name
    assert section.selectbox(key="lr_schedule").value == defaults.lr_schedule
    assert section.selectbox(key="lr_schedule").options == ["constant", "cosine", "step", "onecycle"]
    assert section.checkbox(key="scale_lr").value is defaults.scale_lr
    assert "Each optimizer step sees one batch of 128. Peak learning rate 0.001." in texts(section.caption)
    assert not at.error and not launch_button(at).disabled


def test_accumulation_and_lr_scaling_are_spelled_out(launch_page):
    at = launch_page
    at.number_input(key="accumulate_steps").set_value(4)
    at.checkbox(key="scale_lr").check().run()
    assert not at.error and not launch_button(at).disabled
    assert ("Each optimizer step sees 4 batches of 128: an effective batch of 512. "
            "Peak learning rate 0.001 × 512/256 = 0.002.") in texts(advanced(at).caption)
    assert "One device takes all 128 images per step. Effective batch 512 (4 accumulation steps)." in texts(at.caption)


@pytest.mark.parametrize("key, value, message", [
    ("label_smoothing", 1.0, "label_smoothing 1.0 is not allowed: use a number in [0, 1)"),
    ("warmup_epochs", 4.0, "warmup_epochs 4.0 is not allowed: use a number from 0 to the run's epochs (3)"),
    ("grad_clip", -1.0, "grad_clip -1.0 is not allowed"),
    ("accumulate_steps", 0, "accumulate_steps 0 is not allowed: use a whole number from 1 to 1024"),
])
def test_a_bad_recipe_value_is_shown_next_to_its_field(launch_page, key, value, message):
    at = launch_page
    at.number_input(key=key).set_value(value).run()
    shown = errors_in_column_of(at, key)
    assert len(shown) == 1 and shown[0].startswith(message), shown
    assert launch_button(at).disabled


def test_accumulation_is_refused_for_pipelines_with_the_reason(launch_page):
    at = launch_page
    at.radio(key="strategy").set_value("pp").run()
    at.number_input(key="accumulate_steps").set_value(2).run()
    shown = errors_in_column_of(at, "accumulate_steps")
    assert len(shown) == 1 and "a pipeline already accumulates gradients over its microbatches" in shown[0]
    assert launch_button(at).disabled


RECIPE = {"lr_schedule": "cosine", "warmup_epochs": 0.5, "label_smoothing": 0.1, "grad_clip": 1.0,
          "accumulate_steps": 2, "scale_lr": True}


def fill_in_the_recipe(at: AppTest) -> None:
    at.selectbox(key="model").set_value("test_resnet")
    at.number_input(key="epochs").set_value(1)
    at.selectbox(key="lr_schedule").set_value(RECIPE["lr_schedule"])
    for name in RECIPE_INPUTS:
        at.number_input(key=name).set_value(RECIPE[name])
    at.checkbox(key="scale_lr").check().run()


@pytest.fixture
def cancel_at_the_end(engine, db_url):
    yield
    for listed in store.list_runs(engine):
        if listed.status in ACTIVE_STATUSES:
            cancel(listed.id, db_url=db_url)


def test_a_launched_run_carries_the_recipe(launch_page, engine, cancel_at_the_end):
    at = launch_page
    fill_in_the_recipe(at)
    launch_button(at).click().run()
    assert not at.exception, at.exception
    run = store.get_run(engine, 1)
    assert {k: run.config[k] for k in RECIPE} == RECIPE


def test_every_run_of_a_sweep_carries_the_recipe(launch_page, engine, cancel_at_the_end):
    at = launch_page
    at.radio(key="launch_mode").set_value("Compare strategies").run()
    fill_in_the_recipe(at)
    at.multiselect(key="sweep_strategies").set_value(["single", "ddp", "pp"]).run()
    assert any(e.value.startswith("With pp: accumulate_steps 2") for e in at.error), texts(at.error)
    at.multiselect(key="sweep_strategies").set_value(["single", "ddp"]).run()
    assert not at.error, texts(at.error)
    next(b for b in at.button if b.label.startswith("Launch the sweep")).click().run()
    assert not at.exception, at.exception
    sweep_runs = [store.get_run(engine, i) for i in store.sweep_run_ids(engine, store.list_sweeps(engine)[0]["id"])]
    assert [r.strategy for r in sweep_runs] == ["single", "ddp"]
    assert all({k: r.config[k] for k in RECIPE} == RECIPE for r in sweep_runs)


# --- the effective batch wherever the batch is shown ---

def add_run(engine, *, sweep_id=None, **changes) -> int:
    config = {"dataset": "digits", "model": "test_resnet", "strategy": "single", "devices": ["cpu"], "batch_size": 64,
              "image_size": 16, "amp": "auto", "epochs": 1, **changes}
    run_id = store.create_run(engine, config, status="completed", sweep_id=sweep_id)
    store.log_epoch(engine, run_id, {"epoch": 1, "train_loss": 1.0, "val_loss": 1.0, "train_acc": 0.5, "val_acc": 0.5,
                                     "epoch_time_s": 2.0, "train_time_s": 1.8, "images_per_s": 100.0,
                                     "peak_memory_mb": {"cpu": 500.0}})
    return run_id


def open_page(page: str, **session) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    for key, value in session.items():
        at.session_state[key] = value
    return at.switch_page(page)


def test_the_effective_batch_is_shown_wherever_the_batch_is(parallax_home, cpu_machine, engine):  # noqa: F811
    from reports.sweep_report import format_table, sweep_table

    sweep_id = store.create_sweep(engine, {"batch_size": 64, "accumulate_steps": 4}, ["single", "mp"])
    accumulated = add_run(engine, sweep_id=sweep_id, accumulate_steps=4)
    staged = add_run(engine, sweep_id=sweep_id, accumulate_steps=4, strategy="mp", devices=["cpu", "cpu"])
    before = add_run(engine)  # recorded before accumulation existed: no accumulate_steps in its config

    runs = open_page("pages/runs.py").run()
    shown = runs.dataframe[0].value.set_index("run")
    assert shown.loc[[accumulated, staged, before], "effective batch"].tolist() == [256, 256, 64]
    assert shown.loc[[accumulated, before], "batch"].tolist() == [64, 64]

    run_page = open_page("pages/run.py")
    run_page.query_params["run"] = str(accumulated)
    run_page.run()
    assert any("batch 64 × 4 steps = effective batch 256" in c for c in texts(run_page.caption))

    compare = open_page("pages/compare.py", compare_ids=[staged, accumulated]).run()
    assert not compare.exception, compare.exception
    assert compare.dataframe[0].value["effective batch"].tolist() == [256, 256]

    sweep_page = open_page("pages/sweep.py")
    sweep_page.query_params["sweep"] = str(sweep_id)
    sweep_page.run()
    assert not sweep_page.exception, sweep_page.exception
    assert sweep_page.table[0].value["effective batch"].tolist() == [256, 256]

    report = format_table(sweep_table(engine, sweep_id)).splitlines()
    assert "effective batch" in report[0]
    rows = [line for line in report[1:] if not line.startswith("Why ")]  # the reasons follow the table
    assert rows and all(" 256 " in line for line in rows)


def test_a_learning_rate_past_the_bound_is_taken_with_a_warning_beside_it(launch_page):
    at = launch_page
    at.number_input(key="lr").set_value(50.0).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    columns = [c for c in at.columns if any(w.key == "lr" for w in c.number_input)]
    warnings = texts(min(columns, key=lambda c: len(list(c))).warning)
    assert warnings == ["Learning rate 50 is above 10: training usually diverges there (the loss turns NaN or "
                        "infinite; on a NaN or infinite loss this run will stop)."]
    assert not launch_button(at).disabled

"""A database shared with a newer version of Parallax: a run whose strategy this version does not
know is shown on every page with what this version can read, and the page names the version that
recorded it (was: Compare raised "Unknown strategy ('zero3')"; the Sweep page too). Each run records
the version that created it. Real SQLite, the real pages through AppTest, the real CLI.

    .venv/bin/python -m pytest tests/pages/test_newer_version_runs.py -q
"""

from __future__ import annotations

import json

import pytest

from db import store
from db.recorded_by import VERSION_KEY, parallax_version
from tests.nvml_machines import fake_nvml  # noqa: F401
from tests.pages.test_every_page import add_run, cpu_machine, open_page, run_notes, texts  # noqa: F401
from tests.pages.test_sweep import add_sweep_run
from tests.pages.test_sweep import open_page as open_with_query
from trainer_backend.control.cli import main

NEWER = "1.4.0"


def recorded_by_newer(engine, run_id: int) -> int:
    store.set_measurements(engine, run_id, {VERSION_KEY: NEWER})
    return run_id


@pytest.fixture
def runs(engine):
    single = add_run(engine)
    ddp = add_run(engine, strategy="ddp", devices=["cpu", "cpu"], images_per_s=(60.0, 170.0, 190.0))
    newer = recorded_by_newer(engine, add_run(engine, strategy="zero3", devices=["cpu", "cpu"],
                                              images_per_s=(70.0, 160.0, 160.0), zero_stage=3))
    return single, ddp, newer


def the_note(at, run_id: int, *, run_page: bool = False) -> str:
    """The note on a run a newer version recorded: among the Run page's notes, or on its own elsewhere."""
    (note,) = [text for text in (run_notes(at) if run_page else texts(at.info)) if f"Run #{run_id} was recorded by" in text]
    return note


def test_every_run_records_the_version_that_created_it(engine):
    run_id = store.create_run(engine, {"dataset": "digits", "model": "m", "strategy": "single"})
    assert store.get_run(engine, run_id).measurements[VERSION_KEY] == parallax_version() != "unknown"


def test_compare_shows_a_newer_versions_run_and_names_that_version(runs, parallax_home, engine):
    single, ddp, newer = runs
    at = open_page("pages/compare.py", compare_ids=[newer, ddp, single])
    assert not at.exception, at.exception
    note = the_note(at, newer)
    assert f"recorded by Parallax {NEWER}" in note and "'zero3' is unknown to this version" in note, note
    assert f"({parallax_version()}, which knows single, dp, ddp" in note
    speedups = {m.label: m.value for m in at.metric}  # its throughput is real: measured against the same baseline
    assert speedups == {f"Speedup of #{newer} zero3×2 test_resnet": "1.60×", f"Speedup of #{ddp} ddp×2 test_resnet": "1.80×"}
    assert at.dataframe[0].value["run"].tolist() == [f"#{newer} zero3×2 test_resnet", f"#{ddp} ddp×2 test_resnet",
                                                     f"#{single} single test_resnet"]
    assert "zero_stage" in at.dataframe[1].value.index  # the field only the newer version has, in the differences


def test_the_run_runs_and_sweep_pages_show_it_too(runs, parallax_home, engine):
    single, ddp, newer = runs
    at = open_page("pages/run.py", run_id=newer)
    assert not at.exception, at.exception
    assert f"recorded by Parallax {NEWER}" in the_note(at, newer, run_page=True)
    assert not at.info  # below the numbers, with the run's other notes
    at = open_page("pages/run.py", run_id=ddp)
    assert not [text for text in run_notes(at) + texts(at.info) if "was recorded by" in text]  # a run this version knows: no note

    at = open_page("pages/runs.py")
    assert not at.exception, at.exception
    assert at.dataframe[0].value["strategy"].tolist().count("zero3") == 1
    assert (f"#{newer}: recorded by a newer version of Parallax, with strategies this version ({parallax_version()}) "
            "does not know ('zero3')") in " ".join(texts(at.caption))

    sweep_id = store.create_sweep(engine, {"devices": ["cpu", "cpu"]}, ["single", "ddp", "zero3"])
    add_sweep_run(engine, sweep_id, "single", 100.0)
    add_sweep_run(engine, sweep_id, "ddp", 180.0)
    zero3 = recorded_by_newer(engine, add_sweep_run(engine, sweep_id, "zero3", 190.0))
    at = open_with_query("pages/sweep.py", sweep=str(sweep_id))
    assert not at.exception, at.exception
    assert list(at.table[0].value["strategy"]) == ["single", "ddp", "zero3"]
    assert "Fastest: ZERO3." in at.success[0].value
    assert any("ZERO3: not forecast — a newer version of Parallax recorded it" in text
               for text in texts(at.caption) + texts(at.markdown) + texts(at.info)), zero3


def test_list_and_export_cope_and_export_says_which_version(runs, db_url, capsys):
    single, ddp, newer = runs
    assert main(["--db", db_url, "list"]) == 0
    assert f"run_id={newer} status=completed strategy=zero3" in capsys.readouterr().out
    assert main(["--db", db_url, "export", str(newer)]) == 0
    assert json.loads(capsys.readouterr().out)["measurements"][VERSION_KEY] == NEWER

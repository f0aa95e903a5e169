"""The Launch form's "your own model": a model file in the model folders (outside the checkout) is checked in a
child process, its one-line verdict shown under the fields; a good one launches with its path and arguments in
the run's config, a broken one shows its line and disables Launch, and the dashboard's process never imports it.
A model outside the model folders (a file elsewhere, any installed module's function) is refused with the line
that says how to allow it, and no process is started for it.

    .venv/bin/python -m pytest tests/pages/test_launch_own_model.py -q
"""

from __future__ import annotations

import sys

import pytest
from streamlit.testing.v1 import AppTest

from db import store
from db.run_state import ACTIVE_STATUSES
from tests.nvml_machines import cpu_machine, fake_nvml  # noqa: F401
from tests.support import ROOT
from trainer_backend.control.lifecycle import cancel

pytestmark = pytest.mark.processes  # the check is a child process, and Launch starts a supervisor

APP = str(ROOT / "app.py")
TIMEOUT_S = 240  # the first page imports torch and timm; the child check imports torch again

GOOD = '''
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, width, num_classes=10, in_chans=3):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_chans, width, 3, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes))

    def forward(self, x):
        return self.body(x)
'''

BROKEN = '''
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, width=4, num_classes=10, in_chans=3):
        super().__init__()
        self.head = nn.Linear(in_chans, num_classes)

    def forward(self, x):
        return self.head(x.mean((2, 3))) * undefined_scale
'''


@pytest.fixture
def launch_page(parallax_home, cpu_machine) -> AppTest:  # noqa: F811
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    return at.switch_page("pages/launch.py").run()


@pytest.fixture
def models(parallax_home):
    """The model folder a dashboard takes models from by default: $PARALLAX_HOME/models."""
    folder = parallax_home / "models"
    folder.mkdir()
    return folder


@pytest.fixture
def cancel_at_the_end(engine, db_url):
    yield
    for listed in store.list_runs(engine):
        if listed.status in ACTIVE_STATUSES:
            cancel(listed.id, db_url=db_url)


def plain(text: str) -> str:
    """A line as typed: escape_markdown's backslashes and word joiners (after a colon) taken out."""
    return text.replace("\\", "").replace("\u2060", "")


def launch_button(at: AppTest):
    return next(button for button in at.button if button.label == "Launch")


def choose_own_model(at: AppTest, model: str, model_args: str) -> AppTest:
    at.radio(key="model_kind").set_value("Your own").run()
    at.text_input(key="own_model").set_value(model)
    at.text_input(key="model_args").set_value(model_args).run()
    assert not at.exception, at.exception
    return at


def test_a_good_model_file_is_checked_and_launches_with_its_arguments(launch_page, models, engine,
                                                                      cancel_at_the_end):
    path = models / "mynet.py"
    path.write_text(GOOD)
    at = choose_own_model(launch_page, f"{path}:Net", '{"width": 4}')
    assert not at.error, [e.value for e in at.error]
    verdicts = [s.value for s in at.success]
    assert any(f"model {path}:Net takes num_classes and in_chans" in plain(v) for v in verdicts), verdicts
    assert "mynet" not in sys.modules  # the dashboard's process never imported it
    assert any("not computed here" in c.value for c in at.caption)  # no estimate from the user's code here
    assert not launch_button(at).disabled
    launch_button(at).click().run()
    assert not at.exception, at.exception
    run = store.get_run(engine, 1)
    assert run.config["model"] == f"{path}:Net"
    assert run.config["model_args"] == '{"width": 4}'
    assert run.config["model_source"].startswith(f"{path} sha256=")


def test_a_broken_model_file_shows_its_line_and_disables_launch(launch_page, models):
    path = models / "broken.py"
    path.write_text(BROKEN)
    at = choose_own_model(launch_page, f"{path}:Net", "")
    shown = [plain(e.value) for e in at.error]
    assert any(f"model '{path}:Net': raises in forward" in text and "undefined_scale" in text
               and "(at broken.py:11 in forward)" in text for text in shown), shown
    assert launch_button(at).disabled
    assert "broken" not in sys.modules


def test_a_missing_file_is_refused_without_a_child(launch_page, models):
    at = choose_own_model(launch_page, f"{models}/nowhere.py:Net", "{}")
    shown = [plain(e.value) for e in at.error]
    assert any(f"{models}/nowhere.py is not a file" in text for text in shown), shown
    assert launch_button(at).disabled


def test_a_rerun_reuses_the_verdict_and_an_edit_of_the_file_checks_again(launch_page, models):
    log = models / "imports.log"
    path = models / "counted.py"
    path.write_text(f"open({str(log)!r}, 'a').write('imported\\n')\n" + GOOD)
    at = choose_own_model(launch_page, f"{path}:Net", '{"width": 4}')
    assert not at.error, [e.value for e in at.error]
    assert log.read_text().count("imported") == 1
    at.number_input(key="epochs").set_value(2).run()  # another field: the same model, no new child
    at.run()
    assert not at.error and log.read_text().count("imported") == 1
    path.write_text(path.read_text() + "\n# edited\n")  # a new hash: checked again
    at.run()
    assert not at.error and log.read_text().count("imported") == 2


FLAT = '''
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, num_classes=10, in_chans=3):
        super().__init__()
        self.head = nn.Linear(in_chans, num_classes)

    def forward(self, x):
        return self.head(x.mean((2, 3)))
'''


def test_a_sweep_checks_the_model_under_a_strategy_that_cuts_it_only_where_it_holds_one(launch_page, models):
    path = models / "flat.py"
    path.write_text(FLAT)  # one layer: nothing to cut into stages
    at = launch_page
    at.radio(key="launch_mode").set_value("Compare strategies").run()
    at = choose_own_model(at, f"{path}:Net", "{}")
    assert at.multiselect(key="sweep_strategies").value == ["single", "ddp", "mp", "pp"]
    shown = [plain(e.value) for e in at.error]
    assert any("has 1 layers in sequence, too few" in text and "parallax_stages()" in text for text in shown), shown
    at.multiselect(key="sweep_strategies").set_value(["single", "ddp"]).run()
    assert not at.error, [e.value for e in at.error]
    assert any("takes num_classes and in_chans" in plain(s.value) for s in at.success)


@pytest.mark.parametrize("model, model_args", [
    ("os:system", '{{"command": "touch {marker}"}}'),
    ("subprocess:run", '{{"args": ["touch", "{marker}"]}}'),
    ("{outside}/mynet.py:Net", '{{"width": 4}}'),
    ("{models}/mynet.py:system", '{{"command": "touch {marker}"}}'),
])
def test_a_model_outside_the_model_folders_runs_nothing_and_says_how_to_allow_it(launch_page, models, tmp_path, model,
                                                                                  model_args):
    marker, outside = tmp_path / "ran", tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "mynet.py").write_text(f"open({str(marker)!r}, 'w').close()\n" + GOOD)
    (models / "mynet.py").write_text("from os import system\n" + GOOD)
    at = choose_own_model(launch_page, model.format(outside=outside, models=models),
                          model_args.format(marker=marker))
    shown = " ".join(plain(e.value) for e in at.error)
    assert "is not allowed from the dashboard" in shown, shown
    assert ("add its folder to PARALLAX_MODEL_ROOTS" in shown) or ("mynet.py defines itself" in shown), shown
    assert launch_button(at).disabled
    assert not marker.exists()  # neither the form's check nor anything else ran it
    assert not any(s.value for s in at.success)  # no verdict: no child was started
def test_the_forms_own_model_messages_speak_of_its_fields_not_of_flags(launch_page, models):
    at = choose_own_model(launch_page, "", "{}")  # the field left empty
    shown = [plain(e.value) for e in at.error]
    assert any(text.startswith("Your model is empty: give a .py file and the class or function in it")
               for text in shown), shown
    assert not any("timm model name" in text for text in shown), shown
    path = models / "mynet.py"
    path.write_text(GOOD)
    at = choose_own_model(at, f"{path}:Net", "{}")  # a width it was not given
    shown = [plain(e.value) for e in at.error]
    assert any("give its keyword arguments in “Model arguments (a JSON object)” as a JSON object" in text
               for text in shown), shown
    assert not any("--" in text for text in shown), shown
    assert any("`parallax estimate --model ...`" in c.value for c in at.caption)
    assert not any("trainer_backend" in c.value for c in at.caption)

"""The Launch form is drawn from the field catalogue: a field added to the catalogue (here a fake one, and a
new section whose fields show only where another field says so, as a queue's fields do) is in the form with
its label, help and bounds, its bad value is shown under it, and the page itself lists no ordinary field.

    .venv/bin/python -m pytest tests/pages/test_launch_catalogue.py -q
"""

from __future__ import annotations

import ast
import dataclasses
import sys

import pytest
from streamlit.testing.v1 import AppTest

from tests.nvml_machines import cpu_machine, fake_nvml  # noqa: F401
from tests.support import ROOT
from contract import config as config_module
from contract import fields as fields_module
from contract.config import RunConfig
from contract.fields import FIELDS, Field, when
from ui import launch_memory, memory_views, options, own_model, validation
from ui.field_widgets import SECTIONS, Section, form_sections, widget_help

APP = str(ROOT / "app.py")
TIMEOUT_S = 90  # the first page in a process imports torch and timm
NEW_SECTION = "Queue (a section only this test knows)"
# Drawn by the page's own renderers: their choices come from the machine, the data roots or timm.
RENDERED = {"dataset", "model", "model_args", "strategy", "devices"}

KNOB = Field("fake_knob", int, 5, "Fake knob", "A knob only this test knows.", low=1, high=9, parse=int, step=1,
             section="Training")
WHERE = Field("fake_where", str, "local", "Run where", "Where the run runs.", choices=("local", "slurm"), parse=str,
              section=NEW_SECTION)
PARTITION = Field("fake_partition", str, "", "Partition", "The queue's partition.", parse=str, section=NEW_SECTION,
                  shown_when=when("fake_where", "slurm"), placeholder="gpu")
ADDED = (KNOB, WHERE, PARTITION)


@pytest.fixture
def wider_catalogue(monkeypatch):
    """The catalogue and RunConfig with the added fields, as a new field would be added to both."""
    for spec in ADDED:
        monkeypatch.setitem(fields_module.FIELDS, spec.name, spec)
    wider = dataclasses.make_dataclass("RunConfig", [(s.name, s.kind, s.default) for s in ADDED], bases=(RunConfig,),
                                       frozen=True)
    # Every module that holds the class, whichever tests imported them before this one: the page's
    # modules read RunConfig from their own namespace.
    for module in {config_module, validation, launch_memory, memory_views, options, own_model,
                   *(m for m in list(sys.modules.values()) if getattr(m, "RunConfig", None) is RunConfig)}:
        monkeypatch.setattr(module, "RunConfig", wider)
    monkeypatch.setattr(validation, "DEFAULT_CONFIG", wider())
    return wider


@pytest.fixture
def wider_form(wider_catalogue, parallax_home, cpu_machine) -> AppTest:  # noqa: F811
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.switch_page("pages/launch.py").run()
    assert not at.exception, at.exception
    return at


def launch_button(at: AppTest):
    return next(button for button in at.button if button.label == "Launch")


def test_a_field_added_to_the_catalogue_is_in_its_section_with_its_label_help_and_default(wider_form):
    at = wider_form
    knob = at.number_input(key="fake_knob")
    assert (knob.label, knob.value, knob.help) == ("Fake knob", 5, "A knob only this test knows (a whole number "
                                                   "from 1 to 9).")
    assert not launch_button(at).disabled
    knob.set_value(0).run()
    assert "fake_knob 0 is not allowed: use a whole number from 1 to 9" in [e.value for e in at.error]
    assert launch_button(at).disabled


def test_a_new_section_is_drawn_after_the_known_ones_and_a_field_shows_only_where_its_condition_holds(wider_form):
    at = wider_form
    headings = [h.value for h in at.subheader]
    assert headings[-1] == NEW_SECTION and headings.index("Labels") < headings.index(NEW_SECTION)
    assert at.selectbox(key="fake_where").value == "local"
    assert "fake_partition" not in [w.key for w in at.text_input]  # where is local: no partition to ask for
    at.selectbox(key="fake_where").set_value("slurm").run()
    partition = at.text_input(key="fake_partition")
    assert (partition.label, partition.placeholder, partition.help) == ("Partition", "gpu", "The queue's partition.")
    assert not at.exception and not launch_button(at).disabled


def test_sections_follow_the_layout_table_then_come_in_the_catalogue_order():
    catalogue = {**FIELDS, **{s.name: s for s in ADDED}}
    titles = [section.title for section, _ in form_sections(catalogue)]
    assert titles == [s.title for s in SECTIONS] + [NEW_SECTION]
    drawn = dict((section.title, [f.name for f in fields]) for section, fields in form_sections(catalogue))
    assert drawn["Training"][-1] == "fake_knob" and drawn[NEW_SECTION] == ["fake_where", "fake_partition"]
    assert form_sections(catalogue)[-1][0] == Section(NEW_SECTION)  # three to a row, under a heading


def test_every_field_of_a_section_is_in_the_form_with_the_catalogues_label_and_help(parallax_home, cpu_machine):  # noqa: F811
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.switch_page("pages/launch.py").run()
    at.radio(key="strategy").set_value("pp").run()  # shows the pipeline's own fields too
    at.selectbox(key="where").set_value("slurm").run()  # and the Slurm job's
    # No controller answers here: the section says so in one line instead of listing partitions.
    assert [c.value for c in at.caption if c.value.startswith("Slurm is not offered here: ")], "no reason given"
    widgets = {w.key: w for w in [*at.number_input, *at.selectbox, *at.checkbox, *at.toggle, *at.text_input,
                                  *at.multiselect]}
    generated = {name for name, spec in FIELDS.items() if spec.section is not None} - RENDERED
    assert generated <= set(widgets), generated - set(widgets)
    for name in generated:
        assert (widgets[name].label, widgets[name].help) == (FIELDS[name].label, widget_help(FIELDS[name])), name
    assert at.toggle(key="profile").value is False and at.multiselect(key="augment").options == ["flip", "crop"]


def test_the_page_lists_no_ordinary_field_by_hand():
    """The page reads no catalogue entry by name, and draws a catalogue widget only in its named renderers."""
    source = (ROOT / "pages" / "launch.py").read_text(encoding="utf-8")
    assert "FIELDS" not in source
    tree = ast.parse(source)
    drawers = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            calls = [c for c in ast.walk(node) if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "field_widget"]
            assert not calls, f"line {calls[0].lineno}: a field drawn by hand; give it a section in the catalogue"
    assert {"draw_dataset", "draw_model", "draw_model_args", "draw_strategy", "draw_devices"} <= drawers

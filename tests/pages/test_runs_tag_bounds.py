"""Tags edited on the Runs page are held to the bounds a launch has: at most 64 tags of at most
200 characters (what `run --tags` and a config file allow). Beyond them nothing is saved and the
form says why.

    .venv/bin/python -m pytest tests/pages/test_runs_tag_bounds.py -q
"""

from __future__ import annotations

import pytest

from db import dashboard, store
from tests.nvml_machines import fake_nvml  # noqa: F401
from tests.pages.test_every_page import add_run, cpu_machine, open_page, select_rows, texts  # noqa: F401


def save_tags(at, text: str):
    next(field for field in at.text_input if field.label.startswith("Tags")).set_value(text)
    next(b for b in at.get("form_submit_button") if b.label == "Save").click().run()
    return at


@pytest.mark.parametrize("text", [", ".join(f"t{i}" for i in range(65)), "ok, " + "x" * 201],
                         ids=["65-tags", "a-201-character-tag"])
def test_tags_beyond_the_launch_bounds_are_refused_on_the_runs_page(parallax_home, engine, text):
    run_id = add_run(engine, tags=["old"])
    at = save_tags(select_rows(open_page("pages/runs.py"), [0]), text)
    assert not at.exception, at.exception
    assert any("are not allowed: at most 64 tags of at most 200 characters each" in e for e in texts(at.error)), \
        texts(at.error)
    assert store.get_run(engine, run_id).tags == ["old"]  # nothing saved


def test_tags_at_the_bounds_are_saved(parallax_home, engine):
    run_id = add_run(engine)
    tags = [f"{i:02d}" + "y" * 198 for i in range(64)]
    at = save_tags(select_rows(open_page("pages/runs.py"), [0]), ", ".join(tags))
    assert not at.error, texts(at.error)
    assert store.get_run(engine, run_id).tags == tags


def test_the_store_refuses_them_too(engine):
    run_id = add_run(engine)
    with pytest.raises(ValueError, match="at most 64 tags"):
        dashboard.set_tags(engine, run_id, [f"t{i}" for i in range(65)])
    assert dashboard.set_tags(engine, run_id, [" a ", "a", "", "b"]) == ["a", "b"]

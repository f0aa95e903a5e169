"""The Runs page a page at a time: the count of what matches, Next and Previous pages, ticks kept across
pages for Compare, the search box and the filter line (a malformed one said under it in one line), and the
filters kept in the address.

    .venv/bin/python -m pytest tests/pages/test_runs_paged.py -q
"""

from __future__ import annotations

from db import dashboard, store
from tests.nvml_machines import fake_nvml  # noqa: F401
from tests.pages.test_every_page import add_run, config, cpu_machine, open_page, select_rows, table, texts  # noqa: F401


def add_plain_runs(engine, count: int, **changes) -> list[int]:
    return [store.create_run(engine, config(**changes), status="completed") for _ in range(count)]


def button(at, label: str):
    return next(b for b in at.button if b.label == label)


def test_the_table_pages_through_every_run_counts_them_and_keeps_ticks_across_pages(parallax_home, engine):
    ids = add_plain_runs(engine, dashboard.PAGE_ROWS + 7)
    at = open_page("pages/runs.py")
    assert not at.exception, at.exception
    assert table(at).value["run"].tolist() == ids[::-1][:dashboard.PAGE_ROWS]
    assert any(f"{len(ids)} run(s) match; showing 1–50" in c for c in texts(at.caption))
    assert button(at, "Previous page").disabled and not button(at, "Next page").disabled
    at = select_rows(at, [0])  # the newest run, on the first page
    button(at, "Next page").click().run()
    assert table(at).value["run"].tolist() == ids[::-1][dashboard.PAGE_ROWS:]
    assert any("showing 51–57" in c for c in texts(at.caption)) and button(at, "Next page").disabled
    at = select_rows(at, [6])  # the oldest, on the second page
    assert any(f"Picked on every page: #{ids[-1]}, #{ids[0]}" in c for c in texts(at.caption))
    button(at, "Compare 2 runs").click().run()
    assert texts(at.title) == ["Compare runs"]
    assert at.multiselect(key="compare_picker").value == [ids[-1], ids[0]]


def test_the_search_box_and_the_filter_line_narrow_the_table_and_a_bad_filter_is_said_under_it(parallax_home, engine):
    ddp = add_run(engine, strategy="ddp", devices=["cpu", "cpu"], lr=0.05, tags=["scaling"])
    single = add_run(engine, lr=0.001, val_acc=(0.2, 0.3, 0.4))
    at = open_page("pages/runs.py")
    at.text_input(key="runs_where").set_value("lr > 0.01 and best_val_acc >= 0.9").run()
    assert table(at).value["run"].tolist() == [ddp]
    assert any("1 run(s) match" in c for c in texts(at.caption))
    assert at.query_params["where"] == "lr > 0.01 and best_val_acc >= 0.9"  # a filtered table can be sent
    at.text_input(key="runs_where").set_value("").run()
    at.text_input(key="runs_search").set_value("SCAL").run()
    assert table(at).value["run"].tolist() == [ddp]
    at.text_input(key="runs_search").set_value(f"#{single}").run()
    assert table(at).value["run"].tolist() == [single]
    at.text_input(key="runs_search").set_value("").run()
    at.text_input(key="runs_where").set_value("lr >> 1").run()
    assert not at.exception, at.exception
    [problem] = texts(at.error)
    assert problem.startswith("filter: cannot read 'lr >> 1'") and "\n" not in problem
    assert not at.dataframe  # nothing shown as if it were filtered


def test_an_address_with_a_filter_line_opens_the_table_filtered(parallax_home, engine):
    add_run(engine)
    wanted = add_run(engine, strategy="ddp", devices=["cpu", "cpu"])
    at = open_page("pages/runs.py")
    at.query_params["where"] = "strategy = ddp"
    at.run()
    assert at.text_input(key="runs_where").value == "strategy = ddp"
    assert table(at).value["run"].tolist() == [wanted]


def test_a_run_older_than_the_pickers_newest_runs_opens_on_the_run_and_compare_pages(parallax_home, engine):
    """The pickers list the newest 500 runs, not a whole history, and the run the address names besides."""
    oldest = add_run(engine)
    add_plain_runs(engine, 500)
    at = open_page("pages/run.py")
    at.query_params["run"] = str(oldest)
    at.run()
    assert not at.exception, at.exception
    assert texts(at.title) == [f"Run #{oldest}"] and at.selectbox[0].value == oldest
    assert len(at.selectbox[0].options) == 501
    at = open_page("pages/compare.py")
    at.query_params["runs"] = str(oldest)
    at.run()
    assert not at.exception, at.exception
    assert at.multiselect(key="compare_picker").value == [oldest]

"""Script runs (``import parallax``) on the Runs, Run and Compare pages, through Streamlit's AppTest:
marked and filterable, every logged metric charted by prefix, live while running, beside a launched run
on Compare with its config diff, and strategy scaling said not to apply."""

from __future__ import annotations

import base64
import os
import socket

import numpy as np
import plotly.io
from streamlit.testing.v1 import AppTest

from db import script_metrics, store
from tests.nvml_machines import fake_nvml  # noqa: F401
from tests.pages.test_every_page import APP, TIMEOUT_S, add_run, cpu_machine, open_page, texts  # noqa: F401


def add_script_run(engine, *, status="completed", names=("train/loss", "train/acc", "val/acc", "lr"), steps=20,
                   config=None) -> int:
    run_id = script_metrics.create_script_run(engine, name="baseline", project="resnet",
                                              config=config or {"lr": 0.001, "batch_size": 64}, key="script:test")
    script_metrics.add_points(engine, run_id, [(name, step, step * 0.1, 1.0 / (step + 1))
                                               for step in range(steps) for name in names])
    if status != "running":
        store.set_status(engine, run_id, status)
    return run_id


def values(encoded) -> list[float]:
    """A trace's numbers as plotly's JSON carries them (a typed array: dtype and base64 bytes)."""
    if isinstance(encoded, dict):
        return np.frombuffer(base64.b64decode(encoded["bdata"]), dtype=encoded["dtype"]).tolist()
    return list(encoded)


def test_the_run_page_charts_every_logged_metric_grouped_by_prefix(parallax_home, engine):
    run_id = add_script_run(engine, config={"lr": 0.001, "devices": 2})  # devices as a script may give them
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.query_params["run"] = str(run_id)
    at.switch_page("pages/run.py").run()
    assert not at.exception, at.exception
    figures = [plotly.io.from_json(chart.proto.spec) for chart in at.get("plotly_chart")]
    assert [figure.layout.title.text for figure in figures] == ["train/acc", "train/loss", "val/acc", "lr"]
    assert values(figures[1].data[0].y)[:2] == [1.0, 0.5]
    groups = [m.value for m in at.markdown if m.value.startswith("**")]
    assert groups == ["**train**", "**val**", "**other**"]
    assert any("Strategy scaling (speedup, efficiency) does not apply" in c.value for c in at.caption)
    assert not at.get("iframe")  # the launched runs' live step feed is not a script's
    assert [b.label for b in at.get("download_button")] == ["Download the logged metrics (CSV)"]
    assert not any("unknown to this version" in note.value for note in at.info)  # "script" is no newer strategy


def test_a_running_script_runs_charts_grow_from_their_own_document_and_a_new_name_redraws_it(parallax_home, engine):
    """While the script runs its charts are one embedded document fed by the script-live route (no Streamlit
    chart, no rerun per tick); a name logged for the first time makes the next draw's document chart it too."""
    from ui import script_feed

    run_id = add_script_run(engine, status="running", names=("train/loss",), steps=3)
    store.set_process(engine, run_id, pid=os.getpid(), host=socket.gethostname())  # alive: this process
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.query_params["run"] = str(run_id)
    at.switch_page("pages/run.py").run()
    assert not at.exception, at.exception
    assert not at.get("plotly_chart")
    (live,) = at.get("iframe")
    assert f"{script_feed.ROUTE}/{run_id}?" in str(live.proto) and "train/loss" in str(live.proto)
    assert "val/acc" not in str(live.proto)
    script_metrics.add_points(engine, run_id, [("val/acc", 3, 0.3, 0.5)])
    at.run()  # stands for the progress tick, which reruns the page for a new name
    (live,) = at.get("iframe")
    assert "val/acc" in str(live.proto)
    store.set_status(engine, run_id, "completed")
    at.run()  # ended: drawn by the page, as every finished run is
    assert not at.get("iframe") and len(at.get("plotly_chart")) == 2


def test_runs_marks_script_runs_and_filters_them(parallax_home, engine):
    launched = add_run(engine)
    script = add_script_run(engine)
    at = open_page("pages/runs.py")
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert dict(zip(table["run"], table["trained by"])) == {launched: "launched", script: "script"}
    assert not any("newer version" in caption.value for caption in at.caption)  # "script" is no newer strategy
    at.multiselect(key="filter_kinds").set_value(["script"]).run()
    assert at.dataframe[0].value["run"].tolist() == [script]


def test_runs_shows_what_a_script_summarised_in_the_shared_columns_and_its_own(parallax_home, engine):
    from db.run_figures import BEST_VAL_ACC_LABEL

    script = add_script_run(engine, names=("train/loss",))
    store.set_measurements(engine, script, {"summary": {"best_val_acc": 0.91, "final_loss": 0.12, "note": "tiny"}})
    table = open_page("pages/runs.py").dataframe[0].value.set_index("run")
    assert table.loc[script, BEST_VAL_ACC_LABEL] == 0.91  # not blank: the column every run fills
    assert table.loc[script, "summary: final_loss"] == 0.12 and table.loc[script, "summary: note"] == "tiny"
    assert "summary: best_val_acc" not in table  # it is the best val acc column


def test_compare_puts_a_script_run_beside_a_launched_run(parallax_home, engine):
    launched = add_run(engine)
    store_steps = [{"epoch": 1, "step": step, "t_s": step * 0.1, "train_loss": 2.0 / step, "images_per_s": 100.0,
                    "lr": 0.1} for step in range(1, 11)]
    from db import series

    series.add_steps(engine, launched, store_steps)
    # A script's config names its devices as it likes: the Compare page reads them as names.
    script = add_script_run(engine, names=("train/loss", "val_acc"), config={"lr": 0.001, "devices": [0, 1]})
    at = open_page("pages/compare.py", compare_ids=[launched, script])
    assert not at.exception, at.exception
    assert any(f"Strategy scaling does not apply to #{script}" in c.value for c in at.caption)
    assert "Logged metrics (script runs)" in texts(at.subheader)
    figures = [plotly.io.from_json(chart.proto.spec) for chart in at.get("plotly_chart")]
    loss = next(figure for figure in figures if figure.layout.title.text == "train/loss")
    lines = {line.name.split(" ")[0]: values(line.y) for line in loss.data}
    assert set(lines) == {f"#{launched}", f"#{script}"}  # matched by name: train/loss and train_loss
    assert lines[f"#{launched}"][:2] == [2.0, 1.0]
    differences = at.dataframe[-1].value
    # Only what the runs both have and disagree on: a field a script's config lacks is no difference.
    assert list(differences.index) == ["devices"]
    assert any(c.value.startswith("Fields only some of the runs have") and "lr, model" in c.value.replace("\\", "")
               for c in at.caption)
    assert "Download the logged metrics of the script runs (CSV)" in [b.label for b in at.get("download_button")]


def test_a_one_step_spike_among_twenty_thousand_steps_tops_the_chart_and_a_narrow_window_shows_every_value(
        parallax_home, engine):
    """The loss chart's band reaches the spike's value (a mean of each bucket hid it at 4.1), a NaN is marked,
    and the range picker narrowed around the spike reads it at full resolution."""
    run_id = script_metrics.create_script_run(engine, name="spiky", project="p", config={}, key="script:spiky")
    values = [1.0 + 0.001 * (step % 10) for step in range(20_000)]
    values[12_345], values[15_000] = 100.0, float("nan")
    script_metrics.add_columns(engine, run_id, {"loss": (range(20_000), [0.0] * 20_000, values)})
    store.set_status(engine, run_id, "completed")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.query_params["run"] = str(run_id)
    at.switch_page("pages/run.py").run()
    assert not at.exception, at.exception
    figure = plotly.io.from_json(at.get("plotly_chart")[0].proto.spec)
    by_name = {trace.name: trace for trace in figure.data}
    assert max(values_of(by_name[f"#{run_id} max"].y)) == 100.0  # the band's top is the spike
    assert max(values_of(by_name[f"#{run_id}"].y)) < 2  # the line of last values stays near 1
    assert values_of(by_name[f"#{run_id}: NaN or infinite"].customdata) == [1]
    assert "band: their minimum to maximum" in figure.layout.title.text
    at.slider[0].set_value((12_000, 12_600)).run()  # the range picker: 601 steps, fewer than a chart's buckets
    assert not at.exception, at.exception
    narrow = plotly.io.from_json(at.get("plotly_chart")[0].proto.spec)
    line = {trace.name: trace for trace in narrow.data}[f"#{run_id}"]
    assert len(values_of(line.y)) == 601 and max(values_of(line.y)) == 100.0  # every value, the spike its own


def values_of(encoded) -> list:
    return [value for value in values(encoded) if value is not None]


def test_a_run_of_ten_thousand_metrics_draws_the_first_and_finds_the_others_by_name(parallax_home, engine):
    """Was: every metric read (two queries each) and charted, 10,000 Plotly charts; the page had not drawn after
    two minutes. The browser's draw is timed in tests/e2e/test_browser_script_run.py."""
    names = [f"layer{i // 100:03d}/unit{i % 100:02d}" for i in range(10_000)]
    run_id = add_script_run(engine, names=names, steps=2)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.query_params["run"] = str(run_id)
    at.switch_page("pages/run.py").run()
    assert not at.exception, at.exception
    titles = [plotly.io.from_json(chart.proto.spec).layout.title.text for chart in at.get("plotly_chart")]
    assert sorted(titles) == names[:12]  # in two columns
    assert any("The first 12 of 10,000 logged metrics are drawn" in c.value for c in at.caption)
    (search,) = at.text_input
    assert search.label == "Search the 10,000 logged metric names"

    search.set_value("UNIT07 layer042").run()
    titles = [plotly.io.from_json(chart.proto.spec).layout.title.text for chart in at.get("plotly_chart")]
    assert titles == ["layer042/unit07"]
    search.set_value("layer099").run()
    assert len(at.get("plotly_chart")) == 12
    assert any("12 of the 100 metric names holding 'layer099' are drawn" in c.value for c in at.caption)
    search.set_value("no such metric").run()
    assert not at.get("plotly_chart") and any("No logged metric name holds 'no such metric'" in c.value
                                              for c in at.caption)

"""The Profiler page and the Run page's Profile section through AppTest: charts and downloads for
a profile saved with ``db.profiles.save_profile`` (the download buttons must carry the stored trace,
the op CSV and the HTML report), the empty state, and one real profiled run from the CLI.

    .venv/bin/python -m pytest tests/pages/test_profiler.py -q
"""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest
import streamlit.testing.v1.app_test as app_test_module
from streamlit.runtime.media_file_manager import MediaFileManager
from streamlit.testing.v1 import AppTest

from tests.support import ROOT
from db import profiles, store
from reports.profile import ops_csv

APP = str(ROOT / "app.py")
TIMEOUT_S = 90  # the first page in a process imports torch and timm


class KeptMediaFileManager(MediaFileManager):
    """AppTest's media manager, kept after the run so a download button's bytes can be read."""

    last: KeptMediaFileManager | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        KeptMediaFileManager.last = self


@pytest.fixture
def keep_media(monkeypatch):
    monkeypatch.setattr(app_test_module, "MediaFileManager", KeptMediaFileManager)


def open_page(page: str, **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.switch_page(page)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def download_bytes(at: AppTest, label_start: str) -> bytes:
    """What the download button whose label starts with ``label_start`` would save."""
    button = next(b for b in at.get("download_button") if b.proto.label.startswith(label_start))
    manager = KeptMediaFileManager.last
    url = manager.execute_deferred(button.proto.deferred_file_id) if button.proto.deferred_file_id else button.proto.url
    return manager._storage.get_file(url.rsplit("/", 1)[-1]).content


def download_name(at: AppTest, label_start: str) -> str:
    """The file name the download button whose label starts with ``label_start`` saves under."""
    button = next(b for b in at.get("download_button") if b.proto.label.startswith(label_start))
    manager = KeptMediaFileManager.last
    url = manager.execute_deferred(button.proto.deferred_file_id) if button.proto.deferred_file_id else button.proto.url
    return manager._storage.get_file(url.rsplit("/", 1)[-1]).filename


def fake_profile(engine, run_id: int, rank: int) -> bytes:
    """Save a small, well-formed profile for ``rank``; returns its gzipped trace."""
    ops = [{"name": f"aten::op{i}", "calls": 3, "self_cpu_us": 1000.0 * (i + 1) + rank, "cpu_total_us": 2000.0 * (i + 1),
            "self_device_us": 0.0, "device_total_us": 0.0, "self_cpu_memory_bytes": 2**20 * i,
            "self_device_memory_bytes": 0} for i in range(8)]
    steps = [{"step": s, "data_loading_ms": 1.0, "forward_ms": 10.0, "backward_ms": 20.0, "optimizer_step_ms": 3.0,
              "communication_ms": 5.0 * rank, "other_ms": 2.0, "total_ms": 36.0} for s in range(3)]
    trace = json.dumps({"traceEvents": [{"name": "aten::op0", "ph": "X", "ts": 0, "dur": 5, "pid": rank, "tid": 1}]})
    trace_gz = gzip.compress(trace.encode())
    profiles.save_profile(engine, run_id, rank, ops=ops, steps=steps, trace_gz=trace_gz, trace_bytes=len(trace))
    return trace_gz


def profiled_run(engine, strategy: str = "ddp") -> int:
    devices = ["cpu"] if strategy == "single" else ["cpu", "cpu"]
    run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": strategy,
                                       "devices": devices, "batch_size": 64, "epochs": 1, "profile": True},
                              status="completed")
    for rank in range(len(devices)):
        fake_profile(engine, run_id, rank)
    return run_id


def test_profiler_page_shows_charts_and_downloads_the_stored_bytes(engine, parallax_home, keep_media):
    single_id = profiled_run(engine, "single")
    ddp_id = profiled_run(engine, "ddp")

    at = open_page("pages/profiler.py", run=str(ddp_id))
    assert not at.exception, at.exception
    assert at.selectbox(key="profiled_run").value == ddp_id
    assert at.selectbox(key="profile_rank").options == ["rank 0", "rank 1"]
    assert len(at.get("plotly_chart")) == 3  # breakdown, top ops, memory by op
    assert len(at.dataframe[0].value) == 8  # all 8 ops fit under the default top 15

    assert download_bytes(at, "Trace of rank 1") == profiles.read_trace(engine, ddp_id, 1)
    # Named by its run: traces of two runs downloaded to one folder keep apart.
    assert download_name(at, "Trace of rank 1") == f"parallax-run-{ddp_id}-trace-rank1.json.gz"
    ops = pd.DataFrame(profiles.read_ops(engine, ddp_id))
    assert download_bytes(at, "Op table (CSV)") == ops_csv(ops)
    assert f"Profile of run {ddp_id}" in download_bytes(at, "HTML report").decode()

    # Fewer ops, another rank, and the single run's breakdown beside this one.
    at.slider(key="profile_top_n").set_value(5)
    at.selectbox(key="profile_rank").set_value(1)
    at.selectbox(key="profile_compare").set_value(single_id).run()
    assert not at.exception, at.exception
    assert len(at.dataframe[0].value) == 5
    bars = json.loads(at.get("plotly_chart")[0].proto.spec)["data"][0]["x"]
    assert bars == [f"run {single_id} · rank 0", f"run {ddp_id} · rank 0", f"run {ddp_id} · rank 1"]


def test_profiler_page_says_how_to_profile_when_nothing_is(engine, parallax_home):
    store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "single"}, status="completed")
    at = open_page("pages/profiler.py")
    assert not at.exception, at.exception
    assert "No profiled runs yet" in at.info[0].value
    assert "Profile the first steps" in at.info[0].value and "--profile" in at.info[0].value


def test_run_page_shows_the_profile_section_of_a_profiled_run(engine, parallax_home):
    run_id = profiled_run(engine, "ddp")
    at = open_page("pages/run.py", run=str(run_id))
    assert not at.exception, at.exception
    assert "Profile" in [h.value for h in at.subheader]
    links = [link for link in at.get("page_link") if "Profiler" in link.proto.label]
    assert len(links) == 1 and links[0].proto.page.endswith("profiler")


def test_profiler_page_renders_a_real_profiled_run(cli, engine, parallax_home):
    result = cli("run", "--dataset", "digits", "--model", "test_resnet", "--image-size", "16", "--epochs", "1", "--profile",
                 timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = int(result.stdout.strip().splitlines()[-1].split()[0].split("=")[1])
    assert profiles.profiled_runs(engine) == {run_id}

    at = open_page("pages/profiler.py")
    assert not at.exception, at.exception
    assert at.selectbox(key="profiled_run").value == run_id
    assert not at.error
    assert len(at.get("plotly_chart")) == 3
    assert [b.proto.label for b in at.get("download_button")][0].startswith("Trace of rank 0")

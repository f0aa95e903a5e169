"""The Launch page's memory estimate through Streamlit's AppTest on a CPU machine (NVML faked
as absent): the verdict against the host's available memory, and in "Compare strategies" mode
one row per strategy. The GPU verdict is tested in a real browser (test_memory_browser.py).

    .venv/bin/python -m pytest tests/test_ui_memory.py -q
"""

from __future__ import annotations

import re

import pytest

from nvml_machines import fake_nvml  # noqa: F401
from test_ui_pages import open_page, texts


@pytest.fixture(autouse=True)
def cpu_machine(fake_nvml, monkeypatch):  # noqa: F811
    from nvml_machines import pin_cuda_count

    fake_nvml(None)
    pin_cuda_count(monkeypatch, 0)


def test_the_default_run_fits_in_the_hosts_memory_and_says_by_how_much(parallax_home):
    at = open_page("pages/launch.py")
    assert not at.exception, at.exception
    verdicts = [m for m in texts(at.markdown) if "to spare" in m or "needs about" in m]
    assert len(verdicts) == 1 and re.search(r"cpu: fits, [\d.]+ GB to spare", verdicts[0]), verdicts
    (table,) = [d.value for d in at.dataframe if "total (GB)" in d.value.columns]
    assert table["device"].tolist() == ["cpu"] and table["total (GB)"].iloc[0] > 0
    assert any(text.startswith("On CPU the run measures") for text in texts(at.caption))


def test_compare_strategies_shows_every_strategys_estimate(parallax_home):
    at = open_page("pages/launch.py")
    at.radio(key="launch_mode").set_value("Compare strategies").run()
    assert not at.exception, at.exception
    (table,) = [d.value for d in at.dataframe if "per device (GB)" in d.value.columns]
    assert table["strategy"].tolist() == ["single", "ddp", "mp", "pp"]
    assert all(v.startswith("cpu: fits, ") for v in table["verdict"])
    single, ddp = table.set_index("strategy").loc[["single", "ddp"], "activations (GB)"]
    assert ddp < single  # each ddp process takes half the batch

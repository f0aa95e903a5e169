"""The Launch form's "Keep the dataset on the GPU" (--data-on-device) through AppTest: drawn from the
catalogue, ``on`` refused next to the field on a machine without a GPU, and the choice carried
into the launched run's config.

    .venv/bin/python -m pytest tests/pages/test_launch_data_on_device.py -q
"""

from __future__ import annotations

import pytest

from db import store
from tests.nvml_machines import cpu_machine, fake_nvml  # noqa: F401
from tests.pages.test_launch_recipe import cancel_at_the_end, errors_in_column_of, launch_button, launch_page  # noqa: F401
from contract.fields import FIELDS

# The Launch page's full form asks the backend's inspector, a child process (trainer_backend/control/inspect.py).
pytestmark = pytest.mark.processes


def test_the_choice_starts_at_auto_and_on_is_refused_beside_it_on_a_cpu(launch_page):
    at = launch_page
    box = at.selectbox(key="data_on_device")
    field = FIELDS["data_on_device"]
    assert box.value == "auto" and box.label == field.label
    assert box.options == [field.choice_labels[mode] for mode in ("auto", "on", "off")]
    box.set_value("on").run()
    shown = errors_in_column_of(at, "data_on_device")
    assert len(shown) == 1 and shown[0].startswith("data_on_device on keeps the dataset on a GPU, and this run trains "
                                                   "on cpu"), shown
    assert launch_button(at).disabled


def test_a_launched_run_carries_the_choice(launch_page, engine, cancel_at_the_end):
    at = launch_page
    at.selectbox(key="model").set_value("test_resnet")
    at.number_input(key="epochs").set_value(1)
    at.selectbox(key="data_on_device").set_value("off").run()
    assert not at.error
    launch_button(at).click().run()
    assert not at.exception, at.exception
    assert store.get_run(engine, 1).config["data_on_device"] == "off"


def test_on_is_refused_beside_the_field_where_the_gpu_has_no_room(parallax_home, fake_nvml, monkeypatch):  # noqa: F811
    """cuda:0 (the 4090, listed second by the fake driver) has 1 MB free: digits at 32 px (1.8 MB) cannot be
    kept there; cuda:1 has room."""
    from streamlit.testing.v1 import AppTest

    from tests.nvml_machines import TWO_GPUS, pin_cuda_count
    from tests.pages.test_launch_recipe import APP, TIMEOUT_S

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_nvml([TWO_GPUS[0], {**TWO_GPUS[1], "memory_used_mb": TWO_GPUS[1]["memory_total_mb"] - 1}])
    pin_cuda_count(monkeypatch, 2)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S).switch_page("pages/launch.py").run()
    assert at.multiselect(key="gpus_single").value == [0]
    at.selectbox(key="data_on_device").set_value("on").run()
    shown = [text.replace("\u2060", "") for text in errors_in_column_of(at, "data_on_device")]  # markdown-escaped
    assert shown == ["data_on_device on: the dataset's 2 MB of stored pixels do not fit in the 1 MB free on cuda:0: "
                     "use auto (kept where they take at most a tenth of the free memory) or off"], shown
    assert launch_button(at).disabled
    at.multiselect(key="gpus_single").set_value([1]).run()
    assert not errors_in_column_of(at, "data_on_device") and not launch_button(at).disabled

"""The fastest settings that fit: a speed search's candidates judged by the memory forecast before any is launched
(a configuration the forecast says will not fit is skipped, and said so), each trial a short timed run, and the
answer the settings to launch, with each trial's memory forecast beside what it measured.

    .venv/bin/python -m pytest tests/trainer_backend/control/test_speed_search.py -q
"""

from __future__ import annotations

import math

from contract.config import RunConfig
from contract.search_space import SearchSpace, check_space, parse_param
from db import make_engine
from db.searches import get_search
from reports.search_report import trials_frame
from tests.support import SLEEPER, SLEEPER_ENV, run_cli
from trainer_backend.control.speed_search import default_knobs, plan_speed_search, speed_epochs

HUGE_BATCH = 65_536  # 65,536 images of 128 px: about 100 GB for the sleeping model, far more for a resnet


def test_the_plan_skips_what_will_not_fit_and_what_breaks_a_rule_and_times_the_default_first():
    base = RunConfig(model="test_resnet", image_size=128, batch_size=32, strategy="ddp", devices=("cpu", "cpu"))
    space = check_space(base, SearchSpace(kind="speed", objective="images_per_s", params=(
        parse_param(f"batch_size={HUGE_BATCH},32"), parse_param("strategy=ddp,pp"),
        parse_param("channels_last=false,true"))))
    plan = plan_speed_search(base, space)
    skipped = {tuple(values.values()): why for values, why in plan.skipped}
    assert all("the memory forecast says it does not fit: cpu needs about" in skipped[(HUGE_BATCH, s, c)]
               for s in ("ddp", "pp") for c in (False, True) if (s, c) != ("pp", True))
    assert "channels_last is not allowed with strategy pp" in skipped[(32, "pp", True)]
    assert plan.candidates[0].values == {"batch_size": 32, "strategy": "ddp", "channels_last": False}
    assert {tuple(c.values.values()) for c in plan.candidates} == {(32, "ddp", False), (32, "ddp", True),
                                                                  (32, "pp", False)}
    assert all(c.forecast_mb and all(mb > 0 for mb in c.forecast_mb.values()) for c in plan.candidates)
    assert plan.notes()[0] == "3 configuration(s) to time; 5 skipped before launch."


def test_the_default_knobs_are_what_the_devices_allow():
    knobs = {k.name: k.values for k in default_knobs(RunConfig(strategy="ddp", devices=("cpu", "cpu")))}
    assert knobs == {"strategy": ("single", "ddp", "mp", "pp"), "batch_size": (64, 128, 256),
                     "channels_last": (False, True)}  # no AMP or compile on a CPU


def test_a_speed_trial_is_a_warm_up_epoch_then_its_timed_steps():
    digits = RunConfig(batch_size=32)  # 1,797 images less a fifth: 45 steps an epoch
    assert speed_epochs(digits, timed_steps=20) == 2
    assert speed_epochs(digits, timed_steps=200) == 1 + math.ceil(200 / 45)


def test_a_speed_search_times_what_fits_and_answers_with_the_settings_to_launch(parallax_home):
    result = run_cli("search", "--speed", *SLEEPER, "--image-size", "128", "--batch-size", "32",
                     "--param", f"batch_size=32,{HUGE_BATCH}", "--timed-steps", "20", home=parallax_home,
                     env_extra=SLEEPER_ENV, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "1 configuration(s) to time; 1 skipped before launch." in lines
    assert any(line.startswith(f"Skipped batch_size={HUGE_BATCH}: the memory forecast says it does not fit: cpu "
                               "needs about") for line in lines), lines
    assert [line.split()[0] for line in lines if line.startswith("trial=")] == ["trial=0", "trial=0"]
    assert any(line.startswith("The default settings (batch_size=32) are the fastest that fit here: ")
               for line in lines), lines
    assert "launch with these settings: parallax launch --image-size 128 --model parallax_sleeps_each_step " \
           "--batch-size 32" in lines
    url = f"sqlite:///{parallax_home / 'parallax.db'}"
    frame = trials_frame(make_engine(url), url, get_search(make_engine(url), 1))
    row = frame.iloc[0]
    assert row["state"] == "COMPLETE" and row["epochs"] == 2 and row["images_per_s"] > 0
    assert row["forecast_mb"] > 0 and row["measured_mb"] > 0  # the forecast beside what the run measured

"""The Launch page of a freshly started dashboard is usable at once: its first draw, up to the
Launch button, waits for neither torch nor timm (5–10 s on a small machine); the backend's inspector
imports them in a child process after the button is drawn, and the page then redraws itself with every
model and the parameter count. The dashboard's own process never imports them.

    .venv/bin/python -m pytest tests/pages/test_launch_first_draw.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support import ROOT

# A new interpreter: this test process may have imported torch already.
FIRST_DRAW = r"""
import json, sys
from streamlit.testing.v1 import AppTest
from ui import options

seen = {}
real_load = options.load_training_stack

def load_training_stack():
    seen.setdefault("loaded_before", sorted(m for m in ("torch", "timm") if m in sys.modules))
    real_load()

options.load_training_stack = load_training_stack
at = AppTest.from_file(sys.argv[1], default_timeout=120).run()
launch = [b for b in at.button if b.label == "Launch"]
print(json.dumps({**seen, "exception": [str(e.value) for e in at.exception],
                  "models": len(at.selectbox(key="model").options),
                  "captions": [c.value for c in at.caption],
                  "launch_enabled": bool(launch) and not launch[0].disabled,
                  "loaded_after": sorted(m for m in ("torch", "timm", "torchvision") if m in sys.modules)}))
"""


def test_the_form_is_drawn_before_torch_and_timm_are_imported_then_completed_without_them(parallax_home):
    env = {**os.environ, "PARALLAX_HOME": str(parallax_home), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", FIRST_DRAW, str(ROOT / "app.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert shown["loaded_before"] == []  # the form and its button were drawn before the import
    assert shown["loaded_after"] == []  # the full form's answers came from the inspector, a child process
    assert not shown["exception"]
    assert shown["launch_enabled"]
    assert shown["models"] > 100  # the redraw offers every timm model
    assert "11.2 M parameters for 10 classes" in shown["captions"]
    assert "1,797 images · 10 classes · 8×8 px · 1 band" in shown["captions"]


def test_what_the_first_draw_offers_is_what_the_engine_knows():
    import timm

    from trainer_backend.datasets import BUILTIN_DATASETS
    from ui import options

    assert options.BUILTIN_DATASETS == BUILTIN_DATASETS
    assert set(options.DEFAULT_MODELS) <= set(timm.list_models())


def test_the_checks_before_a_launch_import_no_torch():
    """``launch`` checks every PARALLAX_* value and the dataset limits first; those checks must not
    import torch (about 1.2 s), which only the supervisor needs."""
    probe = ("import sys\n"
             "from trainer_backend.control import lifecycle\n"
             "lifecycle.check_environment()\n"
             "print(sorted(m for m in ('torch', 'timm') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"

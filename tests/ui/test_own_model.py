"""The Launch form's own-model verdict refuses, before any child starts, what the dashboard may not run: a timm
name typed in the own-model field with model arguments that make timm read a file or download into a model folder
(which the same field could then run), and the bytecode Python leaves in a model folder's __pycache__, through
which a form could call anything the source imports.

    .venv/bin/python -m pytest tests/ui/test_own_model.py -q
"""

from __future__ import annotations

import pytest

from contract.config import RunConfig
from ui.own_model import model_verdict


@pytest.mark.parametrize("model_args", [
    {"checkpoint_path": "/etc/hostname"},
    {"cache_dir": "{models}", "pretrained_cfg_overlay": {"url": "http://127.0.0.1:9/mynet.py"}},
    {"pretrained_cfg": {"file": "/etc/hostname"}, "drop_rate": 0.1},
])
def test_a_timm_name_in_the_own_field_takes_no_argument_that_loads_or_downloads(parallax_home, model_args):
    args = {key: value.format(models=parallax_home / "models") if isinstance(value, str) else value
            for key, value in model_args.items()}
    verdict = model_verdict(RunConfig(model="resnet18", model_args=args, pretrained=True))
    assert not verdict.ok and verdict.seconds == 0.0  # refused here: no child was started
    named = sorted(set(args) - {"drop_rate"})
    assert verdict.line.startswith(f"model_args {', '.join(named)} of timm model 'resnet18' is not allowed from "
                                   "the dashboard"), verdict.line
    assert "the command line takes" in verdict.line and "\n" not in verdict.line


def test_a_timm_name_in_the_own_field_keeps_its_architecture_arguments(parallax_home):
    verdict = model_verdict(RunConfig(model="resnet18", model_args={"drop_rate": 0.1}))
    assert verdict.ok and verdict.line == ""  # timm models are checked at preflight, as from the list


def test_the_bytecode_beside_a_model_in_the_folders_runs_nothing(parallax_home, tmp_path):
    import py_compile

    models = parallax_home / "models"
    models.mkdir()
    (models / "mynet.py").write_text("from subprocess import run\n\n\nclass Net:\n    pass\n")
    compiled = py_compile.compile(str(models / "mynet.py"))  # as the check's or the supervisor's import leaves it
    marker = tmp_path / "ran"
    verdict = model_verdict(RunConfig(model=f"{compiled}:run", model_args={"args": ["touch", str(marker)]}))
    assert not verdict.ok and verdict.seconds == 0.0, verdict
    assert f"{compiled} is not Python source" in verdict.line and not marker.exists()

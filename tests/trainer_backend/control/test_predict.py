"""``predict``'s Predictor on a checkpoint of your own model: built as the run built it, and, where the weights do not
fit the model its file builds now, refused in one line saying why (the file edited since the run trained it).

    .venv/bin/python -m pytest tests/trainer_backend/rank/test_predict.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from contract.config import RunConfig
from contract.model_source import with_model_source
from tests.plugins.user_net import NET_SOURCE
from trainer_backend.rank.models import build_model
from trainer_backend.control.predict import Predictor


def write_checkpoint(folder, model_spec: str, model_args: str) -> Path:
    """best.pt as a digits run of ``model_spec`` writes it (trainer.checkpoint_payload's keys)."""
    config = with_model_source(RunConfig(dataset="digits", model=model_spec, model_args=model_args, image_size=16))
    model, kwargs = build_model(config.model, num_classes=10, in_chans=1, model_args=config.model_kwargs)
    path = folder / "best.pt"
    torch.save({"model": model.state_dict(), "config": config.to_dict(), "class_names": [str(d) for d in range(10)],
                "epoch": 1, "val_acc": 0.5, "model_name": config.model, "model_kwargs": kwargs,
                "preprocessing": {"image_size": 16, "stored_size": 16, "bands": None, "band_scale": None,
                                  "mean": [0.3], "std": [0.3], "model_channels": 1}}, path)
    return path


def test_weights_that_no_longer_fit_the_edited_model_file_are_refused_naming_the_change(tmp_path):
    net = tmp_path / "my_net.py"
    net.write_text(NET_SOURCE)
    checkpoint = write_checkpoint(tmp_path, f"{net}:Net", '{"width": 6}')
    assert Predictor(checkpoint, 3).model.head.in_features == 6  # its --model-args, from the checkpoint
    net.write_text(NET_SOURCE.replace("self.head = nn.Linear(width, num_classes)",
                                      "self.head = nn.Sequential(nn.Linear(width, width), nn.Linear(width, num_classes))"))
    with pytest.raises(ValueError) as caught:
        Predictor(checkpoint, 3)
    message = str(caught.value)
    assert message.startswith(f"run 3's weights do not fit the model '{net}:Net' builds now (Error(s) in loading "
                              "state_dict for Net: Missing key(s)") and "\n" not in message
    assert f": {net} changed since the run trained it (recorded sha256=" in message
    assert message.endswith("); put back the file the run trained to use its weights")

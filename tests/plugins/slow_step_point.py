"""Test plugin (PARALLAX_PLUGINS=tests.plugins.slow_step_point): in a torchrun job's first attempt, rank 0 (the
one that writes resume points) takes ``PARALLAX_TEST_SAVE_S`` seconds longer to write each one (a large model on
a slow disk), so that its peers, done with their part of a point at a step, would leave well before it is on
disk."""

from __future__ import annotations

import os
import time

from contract.storage import RESUME_FILE
from trainer_backend.rank import resume

_write = resume.write_remaking_folder


def _slow_write(path, what, write, *args, **kwargs):
    if path.name == RESUME_FILE and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
        time.sleep(float(os.environ.get("PARALLAX_TEST_SAVE_S", "3")))
    return _write(path, what, write, *args, **kwargs)


resume.write_remaking_folder = _slow_write

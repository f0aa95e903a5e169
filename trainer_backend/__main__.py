"""``python -m trainer_backend``: see trainer_backend/cli.py."""

import os
import signal
import sys

# Idle OpenMP threads sleep instead of spinning. A CPU run shares its cores with the dashboard,
# the browser and other runs; spinning threads then starve the ones doing work (measured here:
# 28 vs 143-271 images/s for resnet18 with another process busy). Must be set before torch
# loads OpenMP; a value the user set wins. Spawned ranks inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# `python -m trainer_backend list | head` ends quietly, like any command-line tool.
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

from .cli import main  # noqa: E402  (after the environment is set)

if __name__ == "__main__":
    sys.exit(main())

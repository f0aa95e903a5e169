"""Your own model checked before launch, in a child process, so that an import that crashes, hangs
or eats memory cannot take the dashboard or the command line down with it:

    check_model_before_launch(config)   # ModelError in one line, or the line that describes the model

The child (``python -m trainer_backend.worker.model_check``, the config as JSON on stdin) looks the
dataset's classes and channels up without decoding it, imports the model, builds it on the meta device
and runs one fake forward at the run's image size (custom_model.py); for mp and pp it also cuts the model
into its stages, on the CPU. It runs where a launched worker runs (the project's folder, its PYTHONPATH),
so what it accepts the worker can import. This module imports neither torch nor timm: the child does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from contract.config import RunConfig
from contract.model_source import ModelError, is_custom_model

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CHECK_TIMEOUT_S = 120.0  # importing torch and timm is most of it (seconds); a hung import ends here


def check_model_before_launch(config: RunConfig, *, timeout_s: float = CHECK_TIMEOUT_S) -> str:
    """'' for a timm model (preflight checks those); for your own, the note that says which of
    num_classes and in_chans it takes, or ModelError naming the path and what went wrong."""
    if not is_custom_model(config.model):
        return ""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([sys.executable, "-m", "trainer_backend.worker.model_check"],
                              input=json.dumps(config.to_dict()), capture_output=True, text=True, cwd=PROJECT_ROOT,
                              env=env, timeout=timeout_s, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise ModelError(f"model {config.model!r}: its check did not finish within {timeout_s:g} s (an import or "
                         "forward that hangs?)") from None
    lines = done.stdout.strip().splitlines()
    try:
        verdict = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise ModelError(f"model {config.model!r}: its check ended without a verdict: {tail}") from None
    if verdict.get("error"):
        raise ModelError(verdict["error"])
    return verdict["note"]


def _verdict(config: RunConfig) -> dict:
    from contract.strategy_specs import spec
    from trainer_backend.engine.custom_model import check_custom_model
    from trainer_backend.engine.forecast.memory_estimate import dataset_shape

    num_classes, in_chans = dataset_shape(config)
    given = check_custom_model(config.model, config.model_kwargs, num_classes=num_classes, in_chans=in_chans,
                               image_size=config.image_size)
    if spec(config.strategy).staged:
        from trainer_backend.engine.models import create_model, split_into_stages  # imports timm: only for mp and pp

        model = create_model(config.model, num_classes=num_classes, in_chans=in_chans, model_args=config.model_kwargs)
        stages = config.world_size if spec(config.strategy).distributed else len(config.devices)
        split_into_stages(model, stages, in_chans=in_chans, image_size=config.image_size, name=config.model)
    takes = " and ".join(given) if given else "neither num_classes nor in_chans (its output width is checked)"
    return {"error": "", "note": f"model {config.model} takes {takes}"}


def main() -> int:
    from contract.printable import one_line

    try:
        verdict = _verdict(RunConfig.from_dict(json.loads(sys.stdin.read())))
    except (ValueError, LookupError, OSError) as exc:  # ModelError, EstimateError, a dataset that is not there
        verdict = {"error": one_line(exc)}
    print(json.dumps(verdict), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

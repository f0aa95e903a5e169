"""The inspector: the one child process that answers the dashboard's questions that need torch (timm's
models, a model's parameter count, a dataset's description, a memory estimate and what would fit), so that
the dashboard's own process never imports torch, timm or torchvision.

It is started and asked by trainer_backend/control/inspect.py (the dashboard's one door to the backend):

    python -m trainer_backend.supervisor.inspector    # one JSON question per line on stdin, one answer per line

It imports torch, timm, the datasets and the models once (5-10 s on a small machine), says
``{"ready": true}``, then answers each ``{"ask": name, "args": {...}}`` with ``{"answer": value}`` or
``{"error": one line, "kind": exception class}``. Answers go out on the standard output it was given;
anything a library prints goes to its standard error instead, so that nothing but answers reaches the
dashboard. It ends when its standard input closes (the dashboard has gone), and ignores Ctrl-C, which the
dashboard's terminal sends to both: the dashboard ends it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

# What the full Launch form needs first: imported before the child says it is ready.
PRELOADED = ("timm", "trainer_backend.datasets.prepare", "trainer_backend.rank.models")


def model_names() -> list[str]:
    """Every timm architecture, sorted."""
    import timm

    return timm.list_models()


def model_problem(model: str) -> str | None:
    """Why timm cannot build ``model`` (with close names), or None."""
    from trainer_backend.rank.models import ModelError, check_model_name

    try:
        check_model_name(model)
    except ModelError as exc:
        return str(exc)
    return None


def parameter_count(model: str, num_classes: int, in_chans: int) -> int | None:
    """Parameters of ``model`` sized for the dataset, built on the meta device (no memory, no
    weights, instant even for large models). None if the model cannot be built that way."""
    import timm
    import torch

    from trainer_backend.rank.models import count_parameters

    try:
        with torch.device("meta"):
            return count_parameters(timm.create_model(model, num_classes=num_classes, in_chans=in_chans))
    except Exception:  # a few architectures compute values from tensors in __init__, which meta cannot
        return None


def describe_dataset(choice: str, roots: list[str]) -> dict[str, Any]:
    """``inspect_dataset`` (no decoding), or {"problems": [message]} when the folder is unusable.
    Only what lies inside ``roots`` is read, links included."""
    from pathlib import Path

    from trainer_backend.datasets import DatasetError, inspect_dataset

    try:
        return inspect_dataset(choice, [Path(root) for root in roots])
    except DatasetError as exc:
        return {"problems": [str(exc)], "warnings": []}


def stored_split_size(dataset: str, image_size: int, bands: list[int] | None, band_scale: float | None,
                      val_from: str) -> list[int]:
    """(bytes of the pixels, images) a run stores for its two splits (``datasets.stored_split_size``)."""
    from trainer_backend.datasets import stored_split_size as size

    return list(size(dataset, image_size, tuple(bands) if bands else None, band_scale, val_from))


def estimate_memory(config: dict, num_classes: int, in_chans: int) -> dict:
    """The estimate of ``config`` as a dict (``MemoryEstimate.to_dict``), or {"error": why}."""
    from contract.config import RunConfig
    from trainer_backend.rank.forecast.memory_estimate import estimate_memory as estimate

    try:
        run_config = RunConfig.from_dict(config)
        return estimate(run_config, num_classes=num_classes, in_chans=in_chans).to_dict()
    except ValueError as exc:  # a model, batch or split the estimate names, or a config it cannot read
        return {"error": str(exc)}
    except Exception as exc:  # an architecture fake tensors cannot step: the form stays usable
        return {"error": f"{config.get('model')} could not be stepped under fake tensors ({type(exc).__name__}: {exc})"[:400]}


def suggestions(config: dict, num_classes: int, in_chans: int, free_mb: dict[str, float], gpus: list[str]) -> list[str]:
    """The changes that would fit (``memory_fit.suggestions``), each estimated; none where they cannot be."""
    from contract.config import RunConfig
    from trainer_backend.rank.forecast.memory_fit import suggestions as would_fit

    try:
        return would_fit(RunConfig.from_dict(config), num_classes, in_chans, free_mb, gpus)
    except Exception:  # the estimate itself was made; a change that cannot be estimated is not offered
        return []


ANSWERS = {function.__name__: function for function in (model_names, model_problem, parameter_count,
                                                         describe_dataset, stored_split_size, estimate_memory,
                                                         suggestions)}


def answer(request: dict) -> dict:
    """One question's answer, or the error it raised in one line."""
    from contract.printable import one_line

    try:
        return {"answer": ANSWERS[request["ask"]](**request.get("args", {}))}
    except Exception as exc:
        return {"error": one_line(exc), "kind": type(exc).__name__}


def main() -> int:
    from contract.devices import pin_cuda_device_order

    pin_cuda_device_order()  # before torch is imported, as every process Parallax starts
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a library's print must not pass for an answer

    def say(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    say({"ready": True})
    for line in sys.stdin:
        if line.strip():
            say(answer(json.loads(line)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

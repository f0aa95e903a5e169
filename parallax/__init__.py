"""Log from your own training script into Parallax's dashboard, beside the runs Parallax trains.

    import parallax
    run = parallax.init(project="resnet-sweep", name="baseline", config={"lr": 1e-3, "batch_size": 128})
    for step, (x, y) in enumerate(loader):
        ...
        parallax.log({"train/loss": loss.item(), "lr": sched.get_last_lr()[0]}, step=step)
    parallax.finish()                                  # or `with parallax.init(...) as run:`

A small subset of W&B's API (``init``, ``log``, ``finish``, ``run.config``, ``run.summary``) and
``parallax.profile``; any other W&B name raises NotImplementedError saying what there is instead. Runs go to
the database every Parallax process uses (``PARALLAX_DB_URL``, else SQLite in ``PARALLAX_HOME``).
docs/OWN_SCRIPT.md tells the rest: ranks, how a run ends, offline runs and ``parallax sync``.

Importing this package loads neither torch nor the database: ``init`` opens the database, ``profile``
imports torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from parallax import endings
from parallax.profile_window import profile
from parallax.ranks import rank_info
from parallax.script_run import MODE_ENV, MODES, RESUME_CHOICES, Config, Run
from parallax.values import storable_text

__all__ = ["Config", "Run", "finish", "init", "log", "profile", "run"]

_AVAILABLE = "parallax.init, parallax.log, parallax.finish, parallax.profile, run.config, run.summary"
# W&B names people reach for, and what to use here instead.
_UNSUPPORTED = {
    "watch": "log the gradient norms you want with parallax.log; parallax.profile records where the time goes",
    "unwatch": "there is no watch to undo",
    "Table": "log numbers with parallax.log; put text in run.config or run.summary",
    "Image": "images are not stored; log numbers with parallax.log",
    "Video": "videos are not stored; log numbers with parallax.log",
    "Audio": "audio is not stored; log numbers with parallax.log",
    "Histogram": "histograms are not stored; log summary numbers (mean, max) with parallax.log",
    "Html": "HTML is not stored; log numbers with parallax.log",
    "Object3D": "3D objects are not stored; log numbers with parallax.log",
    "plot": "the dashboard charts every logged metric; log numbers with parallax.log",
    "save": "files are not uploaded; keep them in your own folder and name it in run.config",
    "restore": "files are not uploaded, so there is none to restore",
    "Artifact": "artifacts are not stored; name your files in run.config",
    "log_artifact": "artifacts are not stored; name your files in run.config",
    "use_artifact": "artifacts are not stored; name your files in run.config",
    "alert": "Parallax posts a run's end to the webhooks set in Settings; there are no alerts from a script",
    "sweep": "launch a sweep from the dashboard's Launch page, or call parallax.init once per trial",
    "agent": "launch a sweep from the dashboard's Launch page, or call parallax.init once per trial",
    "login": "there is nothing to log in to: runs go to PARALLAX_DB_URL, or SQLite in PARALLAX_HOME",
    "define_metric": "every logged metric is charted against its step",
    "mark_preempting": "a run killed outright is marked lost; resume it with init(id=..., resume='allow')",
    "Api": "read runs with `parallax export` or the dashboard's CSV downloads",
    "config": "use run.config (the Run that parallax.init returns)",
    "summary": "use run.summary (the Run that parallax.init returns)",
}


def __getattr__(name: str):
    if name in _UNSUPPORTED:
        raise NotImplementedError(f"parallax.{name} is not supported: {_UNSUPPORTED[name]}. There is: {_AVAILABLE}")
    raise AttributeError(f"module 'parallax' has no attribute {name!r}; there is: {_AVAILABLE}")


def init(project: str | None = None, name: str | None = None, config: Mapping[str, Any] | argparse.Namespace | None = None,
         tags: list[str] | tuple[str, ...] | None = None, id: str | None = None, resume: str = "never",
         mode: str = "online", **unsupported: Any) -> Run:
    """Start a run of this script (or, with ``id`` and ``resume``, log on into an earlier one) and return it.

    ``mode``: "online" (the database), "offline" (a file of JSON lines beside the script, for ``parallax sync``)
    or "disabled" (nothing is recorded); ``PARALLAX_MODE`` overrides it. ``resume``: "never" (an existing
    ``id`` is refused), "allow" (log on into it where it exists), "must" (it has to). Under torchrun or
    mp.spawn every rank calls init and they share one run (docs/OWN_SCRIPT.md). A run already going in this
    process is finished first."""
    if unsupported:
        raise NotImplementedError(f"parallax.init does not take {', '.join(sorted(unsupported))}; it takes project, "
                                  "name, config, tags, id, resume, mode")
    mode = os.environ.get(MODE_ENV) or mode
    if mode not in MODES:
        raise ValueError(f"parallax.init: mode={mode!r} is not one of {', '.join(MODES)}"
                         + (f" (from {MODE_ENV})" if os.environ.get(MODE_ENV) else ""))
    if resume not in RESUME_CHOICES:
        raise ValueError(f"parallax.init: resume={resume!r} is not one of {', '.join(RESUME_CHOICES)}")
    if resume != "never" and id is None:
        raise ValueError(f"parallax.init: resume={resume!r} needs the id of the run to resume (id=...)")
    if isinstance(config, argparse.Namespace):
        config = vars(config)
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"parallax.init: config is a dict (or argparse.Namespace), not {type(config).__name__}")
    if isinstance(tags, str) or not all(isinstance(tag, str) for tag in tags or ()):
        raise TypeError(f"parallax.init: tags is a list of strings, got {tags!r}")
    if id is not None and (not isinstance(id, (str, int)) or not str(id).strip() or len(str(id)) > 200):
        raise ValueError(f"parallax.init: id={id!r} must be a non-empty string of up to 200 characters")
    if (previous := endings.current()) is not None:
        previous.finish()
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] not in ("", "-c") else "script"
    # Texts from a non-UTF-8 argument (sys.argv's surrogates) are stored with the odd bytes escaped.
    new = Run(project=storable_text(str(project or script)), name=storable_text(str(name or script)),
              config=dict(config or {}), tags=[storable_text(tag) for tag in tags or ()],
              run_key=None if id is None else storable_text(str(id)), resume=resume, mode=mode, info=rank_info())
    endings.track(new, hooks=mode != "disabled")
    return new


def log(data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
    """Record {name: number} at ``step`` in the current run (see ``Run.log``)."""
    current = endings.current()
    if current is None:
        raise RuntimeError("parallax.log before parallax.init: call parallax.init(...) first")
    current.log(data, step)


def finish(exit_code: int = 0) -> None:
    """End the current run (see ``Run.finish``); nothing to do without one."""
    current = endings.current()
    if current is not None:
        current.finish(exit_code)


def __dir__() -> list[str]:
    return sorted(__all__)


def run() -> Run | None:  # W&B's wandb.run, as a call: the current run, or None
    """The current run of this process, or None."""
    return endings.current()

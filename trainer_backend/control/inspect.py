"""The dashboard's one door to the backend for what the Launch form offers and checks: the data roots and
what they hold, timm's models and their sizes, the memory estimate and what would fit, your own model's check.

The dashboard's process never imports torch (nor timm, nor torchvision). What needs them is asked of one
child process, trainer_backend/supervisor/inspector.py, which imports them once (5-10 s on a small machine) and
then answers in milliseconds; what needs neither is answered here, in the dashboard's process:

    warm_up()                                  # start the child, wait until it has imported torch and timm
    ready()                                    # whether it has (never waits)
    model_names(); model_problem("resnet19")   # every timm architecture; why a name is not one, or None
    parameter_count("resnet18", 10, 3)         # 11181642, or None where meta tensors cannot build it
    describe_dataset("digits", data_roots())   # inspect_dataset's dict, or {"problems": [why]}
    estimate_memory(config, 10, 3)             # MemoryEstimate.to_dict(), or {"error": why}
    fits({"cpu": 900.0}, available_memory_mb(config))   # answered here: NVML and /proc/meminfo

One child serves every session of the server, one question at a time; timm's answers are kept here, the
pages cache the rest. A child that dies or does not answer within ANSWER_TIMEOUT_S is ended; the question
raises InspectorUnavailable, and the next one starts a new child. The child ends with the server (its
standard input closes).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from contract.config import RunConfig
# Answered in this process: none of these imports torch.
from trainer_backend.datasets.limits import too_large_decoded
from trainer_backend.datasets.roots import check_under_roots, data_roots, is_under_roots, offered_lists
from trainer_backend.rank.forecast.free_memory import available_memory_mb, fits
from trainer_backend.supervisor.model_check import check_model_before_launch
from trainer_backend.supervisor.model_roots import MODEL_ROOTS_ENV, check_model_allowed, check_model_args_allowed, model_roots

__all__ = ["MODEL_ROOTS_ENV", "InspectorUnavailable", "available_memory_mb", "check_model_allowed", "check_model_args_allowed",
           "check_model_before_launch", "check_under_roots", "model_roots",
           "data_roots", "describe_dataset", "estimate_memory", "fits", "is_under_roots", "model_names",
           "model_problem", "offered_lists", "parameter_count", "ready", "stored_split_size", "suggestions",
           "too_large_decoded", "warm_up"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CHILD_MODULE = "trainer_backend.supervisor.inspector"
# Importing torch and timm on a busy two-core machine has taken over a minute; a memory estimate of a large
# model at a large image size takes tens of seconds there.
READY_TIMEOUT_S = 300.0
ANSWER_TIMEOUT_S = 300.0


class InspectorUnavailable(RuntimeError):
    """The child that answers questions needing torch died or did not answer in time."""


def parallax_settings() -> dict[str, str]:
    """The settings the child's answers depend on besides the question: the PARALLAX_* variables (the data roots,
    the limits on images and processes, the plugins, the home)."""
    return {name: value for name, value in os.environ.items() if name.startswith("PARALLAX_")}


class Inspector:
    """One child process and the pipe to it; ``ask`` is not thread-safe (the module's lock makes it so)."""

    def __init__(self) -> None:
        self.settings = parallax_settings()  # what it was started with: other settings need another child
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
        # Not a session of its own: Ctrl-C in the terminal, or a signal to the server's process group, reaches it.
        self.process = subprocess.Popen([sys.executable, "-m", CHILD_MODULE], cwd=PROJECT_ROOT, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=False)
        self.ready = False
        self._buffer = b""

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        if not self.ready:
            self._read_message(timeout_s)
            self.ready = True

    def ask(self, question: str, args: dict[str, Any], timeout_s: float = ANSWER_TIMEOUT_S) -> Any:
        self.wait_ready()
        try:
            self.process.stdin.write((json.dumps({"ask": question, "args": args}) + "\n").encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise InspectorUnavailable(f"the inspector process ended (exit status {self.process.poll()})") from None
        reply = self._read_message(timeout_s)
        if "error" in reply:
            raise (ValueError if reply.get("kind") in VALUE_ERRORS else RuntimeError)(reply["error"])
        return reply["answer"]

    def _read_message(self, timeout_s: float) -> dict:
        """The next line the child writes, as JSON; InspectorUnavailable if it ends or stays silent."""
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise InspectorUnavailable(f"the inspector process did not answer within {timeout_s:g} s")
                chunk = os.read(self.process.stdout.fileno(), 1 << 16)
                if not chunk:
                    raise InspectorUnavailable(f"the inspector process ended (exit status {self.process.wait()})")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        """End the child: its standard input closed, then SIGKILL if it is busy."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            self.process.stdout.close()


# The errors a question raises as ValueError: bad input the form shows beside its field.
VALUE_ERRORS = ("ValueError", "ConfigError", "DatasetError", "ModelError", "EstimateError", "OSError",
                "FileNotFoundError", "PermissionError")

_lock = threading.Lock()
_inspector: Inspector | None = None


def _asked(question: str, **args: Any) -> Any:
    """The child's answer to ``question``; a child that fails is ended, and the next question starts another."""
    global _inspector
    with _lock:
        _end_if_outdated()
        if _inspector is None:
            _inspector = Inspector()
        try:
            return _inspector.ask(question, args)
        except InspectorUnavailable:
            _inspector.close()
            _inspector = None
            raise


def _end_if_outdated() -> None:
    """End the child where the PARALLAX_* settings have changed since it started (the lock held): it would answer
    for the old ones (a limit on images, the data roots), and the next question starts one with the new."""
    global _inspector
    if _inspector is not None and _inspector.settings != parallax_settings():
        _inspector.close()
        _inspector = None


def ready() -> bool:
    """Whether the child has imported torch and timm: the full form can be drawn without waiting."""
    inspector = _inspector
    return (inspector is not None and inspector.ready and inspector.process.poll() is None
            and inspector.settings == parallax_settings())


def warm_up() -> None:
    """Start the child where none runs, and wait until it has imported torch and timm (once per server)."""
    global _inspector
    with _lock:
        _end_if_outdated()
        if _inspector is None or _inspector.process.poll() is not None:
            _inspector = Inspector()
        try:
            _inspector.wait_ready()
        except InspectorUnavailable:
            _inspector.close()
            _inspector = None
            raise


def close() -> None:
    """End the child (the server's exit does too)."""
    global _inspector
    with _lock:
        if _inspector is not None:
            _inspector.close()
            _inspector = None


atexit.register(close)


# timm's registry does not change while the server runs: its answers are kept (a question that fails is not),
# so that a redraw of the form never waits behind another session's memory estimate for them.
@functools.lru_cache(maxsize=1)
def model_names() -> list[str]:
    """Every timm architecture."""
    return _asked("model_names")


@functools.lru_cache(maxsize=256)
def model_problem(model: str) -> str | None:
    """Why timm cannot build ``model`` (with close names), or None."""
    return _asked("model_problem", model=model)


@functools.lru_cache(maxsize=256)
def parameter_count(model: str, num_classes: int, in_chans: int) -> int | None:
    """Parameters of ``model`` sized for the dataset (built on the meta device), or None."""
    return _asked("parameter_count", model=model, num_classes=num_classes, in_chans=in_chans)


def describe_dataset(choice: str, roots: list[Path]) -> dict[str, Any]:
    """``inspect_dataset`` (no decoding), or {"problems": [message], "warnings": []} when the folder is
    unusable. Only what lies inside ``roots`` is read, links included."""
    return _asked("describe_dataset", choice=choice, roots=[str(root) for root in roots])


def stored_split_size(dataset: str, image_size: int, bands=None, band_scale=None, val_from: str = "test"
                      ) -> tuple[int, int]:
    """(bytes of the pixels, images) a run stores for its two splits; ValueError for a folder that is
    missing or unreadable."""
    stored, images = _asked("stored_split_size", dataset=dataset, image_size=image_size,
                            bands=list(bands) if bands else None, band_scale=band_scale, val_from=val_from)
    return stored, images


def estimate_memory(config: RunConfig, num_classes: int, in_chans: int) -> dict:
    """The estimate of ``config`` as a dict (``MemoryEstimate.to_dict``), or {"error": why}."""
    return _asked("estimate_memory", config=config.to_dict(), num_classes=num_classes, in_chans=in_chans)


def suggestions(config: RunConfig, num_classes: int, in_chans: int, free_mb: dict[str, float],
                gpus: list[str]) -> list[str]:
    """The changes that would fit, each estimated (``memory_fit.suggestions``)."""
    return _asked("suggestions", config=config.to_dict(), num_classes=num_classes, in_chans=in_chans,
                  free_mb=free_mb, gpus=list(gpus))

"""The Launch form's "your own model": its verdict comes from the same child process the command line
uses (trainer_backend/supervisor/model_check.py, through trainer_backend/control/inspect.py), so that a broken
import, a hang or a crash in the user's code never runs in the dashboard's process. The dashboard itself only
finds the file and hashes it, and starts no check for a model outside the model folders the machine's owner set
(supervisor/model_roots.py).

    verdict = model_verdict(config)   # Verdict(ok=True, line="model /abs/mynet.py:Net takes num_classes ...")

A verdict is cached per (model, its arguments, the source file's SHA-256, dataset, bands, image size,
strategy, device count): a rerun of the form does not start the child again, an edit of the file does.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import streamlit as st

from contract.config import RunConfig
from contract.model_source import ModelError, with_model_source

TIMM, OWN = "timm", "Your own"


class Verdict(NamedTuple):
    ok: bool
    line: str  # the check's one line: what the model takes, or what went wrong
    seconds: float  # how long the child took (0 where the file could not even be found)


def model_verdict(config: RunConfig) -> Verdict:
    """The child's verdict on ``config``'s own model, cached (see the module's docstring)."""
    from trainer_backend.control.inspect import check_model_allowed, check_model_args_allowed

    try:
        check_model_allowed(config.model)  # a form runs only what the owner put in the model folders
        check_model_args_allowed(config.model, config.model_kwargs)  # a timm name typed here: no file or download
        config = with_model_source(config)  # absolute path and '<file> sha256=<hex>'; finds, never imports
    except ModelError as exc:
        return Verdict(False, str(exc), 0.0)
    return _checked(config.model, config.model_args, config.model_source, config.dataset, config.bands,
                    config.image_size, config.strategy, len(config.devices), _config=config)


@st.cache_data(show_spinner=False, max_entries=64)
def _checked(model: str, model_args: str, source: str, dataset: str, bands, image_size: int, strategy: str,
             devices: int, *, _config: RunConfig) -> Verdict:
    from trainer_backend.control.inspect import check_model_before_launch

    started = time.perf_counter()
    try:
        line = check_model_before_launch(_config)
    except ModelError as exc:
        return Verdict(False, str(exc), time.perf_counter() - started)
    return Verdict(True, line, time.perf_counter() - started)


def allowed_folders() -> str:
    """Where the dashboard takes your own models from, and how to change it, for the field's help."""
    from trainer_backend.control.inspect import MODEL_ROOTS_ENV, model_roots

    return f"the model folders ({', '.join(str(root) for root in model_roots())}; {MODEL_ROOTS_ENV} sets others)"


def config_to_check(config: RunConfig, sweep_strategies: list[str] | None) -> RunConfig:
    """The config whose model the child checks: the form's, or for a sweep the first strategy that cuts the
    model into stages (mp, pp: the strictest check), else single on one device."""
    from contract.config import ConfigError
    from contract.strategy_specs import baseline, spec

    if sweep_strategies is None:
        return config
    staged = [name for name in sweep_strategies if spec(name).staged]
    try:
        if staged:
            return config.replace(strategy=staged[0]) if config.strategy != staged[0] else config
        return config.replace(strategy=baseline().name, devices=config.devices[:1])
    except ConfigError:  # that strategy's own rules fail here: the sweep's field checks say so
        return config

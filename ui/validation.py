"""Check the Launch form with the same code the trainer uses: build a ``RunConfig``.

``RunConfig`` stops at the first bad field. To show every bad field at once, the form swaps a
field that failed for its default and builds again, until the config builds or a field fails
twice (a clash between fields that a default cannot resolve).

    config, errors = validate_form({"epochs": 0, "batch_size": 5, "strategy": "ddp", ...})
    errors == {"epochs": "epochs 0 is not allowed: ...", "batch_size": "batch_size 5 is the global ..."}
"""

from __future__ import annotations

import re
from typing import Any

from contract.config import ConfigError, RunConfig
from contract.fields import FIELDS

DEFAULT_CONFIG = RunConfig()
OWN_MODEL_LABEL = "Your model"  # the form's own-model field (pages/launch.py)
EMPTY_OWN_MODEL = (f"{OWN_MODEL_LABEL} is empty: give a .py file and the class or function in it that builds the "
                   "model, e.g. ~/nets/mynet.py:Net, or an importable module's, e.g. mypkg.nets:resnet_like")
_FLAG = re.compile(r"--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def in_form_words(message: str) -> str:
    """A message Parallax words for the command line, in the form's words: each field's flag
    (``--model-args``) is the field's label, and the command is ``parallax``."""
    def label(match: re.Match) -> str:
        field = FIELDS.get(match.group(1).replace("-", "_"))
        return f"“{field.label}”" if field is not None and field.section is not None else match.group(0)

    return _FLAG.sub(label, message.replace("python -m trainer_backend", "parallax"))


def validate_form(values: dict[str, Any]) -> tuple[RunConfig | None, dict[str, str]]:
    """(config, {}) when every value is good, else (None, {field: message})."""
    errors: dict[str, str] = {}
    trial = dict(values)
    for _ in range(len(values) + 1):
        try:
            config = RunConfig(**trial)
        except ConfigError as exc:
            if exc.field in errors or exc.field not in trial:
                errors.setdefault(exc.field, str(exc))
                return None, errors
            errors[exc.field] = str(exc)
            trial[exc.field] = getattr(DEFAULT_CONFIG, exc.field)
        else:
            return (None, errors) if errors else (config, {})
    return None, errors

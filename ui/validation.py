"""Check the Launch form with the same code the trainer uses: build a ``RunConfig``.

``RunConfig`` stops at the first bad field. To show every bad field at once, the form swaps a
field that failed for its default and builds again, until the config builds or a field fails
twice (a clash between fields that a default cannot resolve).

    config, errors = validate_form({"epochs": 0, "batch_size": 5, "strategy": "ddp", ...})
    errors == {"epochs": "epochs 0 is not allowed: ...", "batch_size": "batch_size 5 is the global ..."}
"""

from __future__ import annotations

from typing import Any

from contract.config import ConfigError, RunConfig

DEFAULT_CONFIG = RunConfig()


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

"""Which version of Parallax recorded a run, for a database that several versions share.

    measurements = {VERSION_KEY: parallax_version()}     # what create_run stores with every run
    recorded_by(run.measurements)                         # "0.9.0", or None for a run recorded before

A newer version may record runs this one cannot fully read (a strategy it does not know): the
pages show such a run with what they can and name the version that recorded it
(``unknown_strategy_note``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from contract.strategy_specs import STRATEGY_SPECS, find

VERSION_KEY = "parallax_version"  # in Run.measurements, beside process_start
DISTRIBUTION = "parallax-train"


@functools.cache
def parallax_version() -> str:
    """This installation's version (pyproject's), or "unknown" where it is not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def recorded_by(measurements: Mapping[str, Any] | None) -> str | None:
    value = (measurements or {}).get(VERSION_KEY)
    return value if isinstance(value, str) and value else None


def unknown_strategy_note(run_id: int, strategy: str, measurements: Mapping[str, Any] | None) -> str | None:
    """One line for a run whose strategy this version does not know, naming the version that recorded
    it; None for a run this version can read whole."""
    if find(strategy) is not None or "script" in (measurements or {}):  # a script names its strategy as it likes
        return None
    version = recorded_by(measurements)
    who = f"Parallax {version}" if version else "a version of Parallax that did not record its version"
    return (f"Run #{run_id} was recorded by {who}; its strategy {str(strategy)[:64]!r} is unknown to this version "
            f"({parallax_version()}, which knows {', '.join(STRATEGY_SPECS)}): it is shown with what this version "
            "can read.")


def unknown_strategies_line(runs: list[tuple[int, str]]) -> str | None:
    """One line for a list of (run id, strategy) holding runs of strategies this version does not know."""
    newer = [(run_id, strategy) for run_id, strategy in runs if find(strategy) is None]
    if not newer:
        return None
    names = ", ".join(dict.fromkeys(repr(str(strategy)[:64]) for _, strategy in newer))
    return (f"{', '.join(f'#{run_id}' for run_id, _ in newer)}: recorded by a newer version of Parallax, with "
            f"strategies this version ({parallax_version()}) does not know ({names}); each run's page names the "
            "version and shows what this one can read.")

"""What the Launch form starts from: the CLI's defaults, then, for the rest of the browser session, the
values of the last launch, or a run's own config after "Launch again with these settings" on its Run
page (loaded into the form to edit before launching, as ClearML's clone does).

Streamlit forgets a page's widgets once another page is shown, so a form drawn again would start from
the defaults; it starts from ``form_start()`` instead, kept in the session (never shared between users).

    start = form_start()                      # on the Launch page, before its widgets
    remember(FormStart(config, ...))          # when a launch succeeds
    load_run(run.config); st.switch_page(LAUNCH_PAGE)   # on a Run page
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from contract.config import ConfigError, RunConfig
from contract.strategy_specs import SPECS

START_KEY = "launch_form_start"


@dataclass(frozen=True)
class FormStart:
    """The form's first values: a whole config, and in sweep mode the strategies and device counts."""

    config: RunConfig
    sweeping: bool = False
    sweep_strategies: tuple[str, ...] | None = None  # None: those the devices allow
    device_counts: str = ""
    said: str | None = None  # one line for the top of the form (where the values come from)


def form_start() -> FormStart:
    return st.session_state.get(START_KEY) or FormStart(RunConfig())


def remember(start: FormStart) -> None:
    st.session_state[START_KEY] = start


def load_run(run_id: int, config: dict) -> str | None:
    """Start the form from run ``run_id``'s ``config``; the reason it cannot (a config this version no
    longer accepts), or None."""
    try:
        loaded = RunConfig.from_dict({key: value for key, value in config.items() if key != "nodes"})
    except (ConfigError, TypeError) as exc:
        return f"Run #{run_id}'s settings cannot be loaded into the form: {exc}"
    remember(FormStart(loaded, said=f"The form holds run #{run_id}'s settings: edit them, then launch."))
    return None


def index_of(choices: list, value, fallback: int = 0) -> int:
    """Where ``value`` is among ``choices`` (a dataset folder since removed falls back)."""
    return choices.index(value) if value in choices else fallback


def strategies_allowed(device_count: int) -> list[str]:
    """The sweep's usual strategies that ``device_count`` devices can run: single always; DDP, MP and PP
    (each needs a second process or stage) from two devices."""
    return [s.name for s in SPECS if s.in_first_sweep and (s.one_device or device_count >= 2)]

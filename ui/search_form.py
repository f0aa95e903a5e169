"""The Launch form's Search mode: the fields to vary (each as a range or choices, in the words of
``parallax search --param``), the objective, the budget, trials at once, the sampler and the pruner, checked
as the command line checks them (contract/search_space.py), and the button that starts the search's driver.

    space, errors = search_section(config)       # below the run's own fields, which are the search's base
"""

from __future__ import annotations

import streamlit as st

from contract.config import ConfigError, RunConfig
from contract.fields import FIELDS
from contract.search_space import (DEFAULT_TIMED_STEPS, MAX_AT_ONCE, MAX_TRIALS, OBJECTIVES, PRUNERS, SAMPLERS,
                                   SEARCHABLE, SPEED_FIELDS, SearchSpace, check_space, parse_param)
from ui.text import escape_markdown

HYPER, SPEED = "The best hyperparameters", "The fastest settings that fit"
LOG_RANGES = {"lr": "1e-4:1e-1:log", "weight_decay": "1e-6:1e-2:log"}
PRUNER_WORDS = {"none": "none: every trial trains to its end", "median": "median: below the median of earlier trials "
                "at the same epoch", "halving": "successive halving", "hyperband": "Hyperband"}


def starting_text(name: str, base: RunConfig) -> str:
    """What a field's range or choices start as: a log range for the learning rate and weight decay, every choice of
    a choice field, false and true for a switch, and around the base's value for other numbers."""
    spec, value = FIELDS[name], getattr(base, name)
    if name in LOG_RANGES:
        return f"{name}={LOG_RANGES[name]}"
    if spec.kind is bool:
        return f"{name}=false,true"
    if spec.choices is not None:
        return f"{name}=" + ",".join(spec.choices)
    if spec.kind is int:
        picks = dict.fromkeys(v for v in (value // 2, value, value * 2) if spec.allows(v))
        return f"{name}=" + ",".join(map(str, picks))
    if spec.kind is float:
        return f"{name}={value / 10:g}:{value * 10:g}:log" if value > 0 else f"{name}=0:{min(spec.high or 1.0, 0.5):g}"
    return f"{name}={value}"


def search_section(config: RunConfig | None) -> tuple[SearchSpace | None, dict[str, str]]:
    """Draw the search's own settings under the form; the space (checked with ``config``, the base) and the errors
    by field, one line each."""
    st.subheader("Search")
    kind = st.radio("Find", [HYPER, SPEED], horizontal=True, key="search_kind",
                    captions=["trials drawn by Optuna, the hopeless ones pruned",
                              "short timed runs; the memory forecast skips what will not fit"])
    speed = kind == SPEED
    errors: dict[str, str] = {}
    labels = {name: FIELDS[name].label for name in SEARCHABLE}
    offered = [n for n in SEARCHABLE if n in SPEED_FIELDS] if speed else list(SEARCHABLE)
    picked = st.multiselect(
        "Fields to vary", offered, default=[] if speed else ["lr"], key=f"search_fields_{'speed' if speed else 'hyper'}",
        format_func=lambda name: f"{name} ({labels[name]})",
        help="Each one a range (LOW:HIGH, :log to draw it log-uniformly) or choices (A,B,C), as "
        "`parallax search --param` takes them." + (" None: strategy, batch size and channels_last (and AMP and "
                                                    "compile on GPUs)." if speed else ""))
    params = []
    base = config or RunConfig()
    for name in picked:
        text = st.text_input(f"{name}", value=starting_text(name, base), key=f"search_param_{name}", max_chars=2000)
        try:
            params.append(parse_param(text if text.startswith(f"{name}=") else f"{name}={text}"))
        except ConfigError as exc:
            errors[f"param:{name}"] = str(exc)
            st.error(escape_markdown(exc), icon=":material/error:")
    objectives = ["images_per_s"] if speed else [k for k in OBJECTIVES if k != "images_per_s"] + ["images_per_s"]
    left, middle, right = st.columns(3)
    objective = left.selectbox("Objective", objectives, key="search_objective",
                               format_func=lambda k: f"{k}: {OBJECTIVES[k][1]}")
    trials = middle.number_input("Trials", min_value=1, max_value=MAX_TRIALS, value=8 if not speed else 12, step=1,
                                 key="search_trials")
    at_once = right.number_input("Trials at once", min_value=1, max_value=MAX_AT_ONCE, value=1, step=1,
                                 key="search_at_once", help="They wait in this machine's queue (PARALLAX_CPU_RUNS CPU "
                                 "runs at a time); on Slurm, one job array with this many at once.")
    left, middle, right = st.columns(3)
    sampler = left.selectbox("Sampler", SAMPLERS, key="search_sampler", disabled=speed)
    pruner = middle.selectbox("Pruner", PRUNERS, key="search_pruner", index=0 if speed else PRUNERS.index("median"),
                              format_func=PRUNER_WORDS.get, disabled=speed or len(OBJECTIVES[objective][0]) > 1)
    timeout_s = right.number_input("Wall-time budget (s, 0: none)", min_value=0.0, value=0.0, step=600.0,
                                   key="search_timeout_s")
    target_acc, timed_steps = 0.9, DEFAULT_TIMED_STEPS
    if objective == "time_to_acc":
        target_acc = st.number_input("Target validation accuracy", min_value=0.01, max_value=1.0, value=0.9,
                                     step=0.05, key="search_target_acc")
    if speed:
        timed_steps = st.number_input("Timed steps per trial (after a warm-up epoch)", min_value=1, value=timed_steps,
                                      step=50, key="search_timed_steps")
    space = SearchSpace(params=tuple(params), kind="speed" if speed else "hyper", objective=objective,
                        target_acc=float(target_acc), trials=int(trials), timeout_s=float(timeout_s),
                        at_once=int(at_once), sampler="tpe" if speed else sampler,
                        pruner="none" if speed or len(OBJECTIVES[objective][0]) > 1 else pruner,
                        timed_steps=int(timed_steps))
    if config is None or errors:
        return None, errors
    if speed and not params:
        from trainer_backend.control.speed_search import with_default_knobs

        space = with_default_knobs(config, space)
    try:
        space = check_space(config, space)
    except ConfigError as exc:
        errors["search"] = str(exc)
        st.error(escape_markdown(exc), icon=":material/error:")
        return None, errors
    for note in space.notes:
        st.caption(escape_markdown(note))
    return space, errors

"""The Launch form's widget for a field of the catalogue (trainer_backend/contract/fields.py): its label, help,
choices and key come from the catalogue, so the form says what ``--help`` says.

    values["epochs"] = field_widget(FIELDS["epochs"], DEFAULTS.epochs)
    # st.number_input("Epochs", value=3, step=1, key="epochs", help="Passes over ... (a whole number from 1 to 10000)")

Numbers get no min_value/max_value on purpose: Streamlit would silently put a value outside them back to the
default, where the form shows RunConfig's own message under the field ("epochs 0 is not allowed: use a whole
number from 1 to 10000"); the bounds are in the help instead.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from trainer_backend.contract.fields import Field


def widget_help(spec: Field) -> str:
    """The catalogue's help, with the bounds of a number where they are fixed."""
    if spec.kind in (int, float) and None not in (spec.low, spec.high):
        return f"{spec.help.rstrip('.')} ({spec.allowed})."
    return spec.help


def widget_spec(spec: Field, value: Any, **overrides: Any) -> tuple[str, dict[str, Any]]:
    """(Streamlit widget function name, its keyword arguments) for ``spec`` showing ``value``; ``overrides``
    (placeholder, max_chars ...) are passed on as they are."""
    kwargs: dict[str, Any] = {"label": spec.label, "key": spec.name, "help": widget_help(spec)}
    if spec.kind is bool:
        kind = "checkbox"
        kwargs["value"] = bool(value)
    elif spec.choices is not None:
        kind = "selectbox"
        kwargs.update(options=spec.choices, index=spec.choices.index(value))
        if spec.choice_labels:
            kwargs["format_func"] = spec.choice_labels.__getitem__
    elif spec.kind in (int, float):
        kind = "number_input"
        kwargs.update(value=spec.kind(value), step=spec.kind(spec.step or 1))
        if spec.kind is float and kwargs["step"] < 0.01:
            kwargs["format"] = "%g"  # 0.0001, not 0.00
    else:
        kind = "text_input"
        kwargs["value"] = "" if value is None else str(value)
    kwargs.update(overrides)
    return kind, kwargs


def field_widget(spec: Field, value: Any, *, toggle: bool = False, **overrides: Any) -> Any:
    """Draw ``spec``'s widget (a toggle instead of a checkbox where ``toggle``) and return what it holds."""
    kind, kwargs = widget_spec(spec, value, **overrides)
    if toggle and kind == "checkbox":
        kind = "toggle"
    return getattr(st, kind)(**kwargs)

"""The Launch form drawn from the field catalogue (contract/fields.py): each field's section, label,
help, choices, key and when it is shown come from its entry, so the form says what ``--help`` says and a field
added to the catalogue is in the form with no page code.

    values["epochs"] = field_widget(FIELDS["epochs"], DEFAULTS.epochs)
    # st.number_input("Epochs", value=3, step=1, key="epochs", help="Passes over ... (a whole number from 1 to 10000)")
    for section in form_sections():                 # Data, Model, ..., Labels, then any section new to SECTIONS
        draw_section(section, start, values, slots, renderers={"dataset": draw_dataset, ...})

Numbers get no min_value/max_value on purpose: Streamlit would silently put a value outside them back to the
default, where the form shows RunConfig's own message under the field ("epochs 0 is not allowed: use a whole
number from 1 to 10000"); the bounds are in the help instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import streamlit as st

from contract.fields import FIELDS, SLURM_SECTION, Field


@dataclass(frozen=True)
class Section:
    """How a section of the form is laid out: a heading or a closed expander, its fields row by row in
    ``columns`` (a count, or relative widths), or half the page's width, beside the next half section."""

    title: str
    expander: bool = False
    columns: int | tuple[int, ...] = 3
    half: bool = False


# The sections in the order the form draws them; a section a field names that is not here is drawn after these,
# as a heading with three fields to a row.
SECTIONS: tuple[Section, ...] = (
    Section("Data", columns=1, half=True), Section("Model", columns=1, half=True),
    Section("Strategy", columns=1, half=True), Section("Devices", columns=1, half=True),
    Section("Training"),
    Section("More options", expander=True, columns=2),
    # Three to a row: an error under a field needs room to be read.
    Section("Advanced", expander=True),
    Section(SLURM_SECTION, expander=True),
    Section("Labels", columns=(1, 2)),
)

Renderer = Callable[[Field, Any], Any]  # (entry, the value the form starts from) -> the value for RunConfig


def widget_help(spec: Field) -> str:
    """The catalogue's help, with the bounds of a number where they are fixed."""
    if spec.kind in (int, float) and None not in (spec.low, spec.high):
        return f"{spec.help.rstrip('.')} ({spec.allowed})."
    return spec.help


def offered(spec: Field) -> Sequence[str]:
    """What a choice or a multiselect offers: the catalogue's fixed choices, else its options (or what their
    function gives now)."""
    if spec.choices is not None:
        return spec.choices
    options = spec.options() if callable(spec.options) else spec.options
    return tuple(options or ())


def widget_spec(spec: Field, value: Any, **overrides: Any) -> tuple[str, dict[str, Any]]:
    """(Streamlit widget function name, its keyword arguments) for ``spec`` showing ``value`` (a RunConfig value);
    ``overrides`` (placeholder, max_chars ...) are passed on as they are."""
    kwargs: dict[str, Any] = {"label": spec.label, "key": spec.name, "help": widget_help(spec)}
    if spec.kind is bool:
        kind = "toggle" if spec.widget == "toggle" else "checkbox"
        kwargs["value"] = bool(value)
    elif spec.widget == "multiselect":
        kind = "multiselect"
        options = offered(spec)
        kwargs.update(options=options, default=[item for item in str(value).split(",") if item in options])
    elif spec.choices is not None or spec.options is not None:
        kind = "radio" if spec.widget == "radio" else "selectbox"
        options = offered(spec)
        kwargs.update(options=options, index=list(options).index(value) if value in options else 0)
        if spec.choice_labels:
            kwargs["format_func"] = lambda choice: spec.choice_labels.get(choice, choice)
    elif spec.kind in (int, float):
        kind = "number_input"
        # None where the field has no default (a blank box: the run decides), else a number of the field's kind.
        kwargs.update(value=None if value is None else spec.kind(value), step=spec.kind(spec.step or 1))
        if spec.kind is float and kwargs["step"] < 0.01:
            kwargs["format"] = "%g"  # 0.0001, not 0.00
    else:
        kind = "text_input"
        kwargs["value"] = ("" if value is None else spec.separator.join(map(str, value)) if isinstance(value, tuple)
                           else str(value))
    for name in ("placeholder", "max_chars"):
        if getattr(spec, name) is not None and kind == "text_input":
            kwargs[name] = getattr(spec, name)
    kwargs.update(overrides)
    return kind, kwargs


def config_value(spec: Field, held: Any) -> Any:
    """What a widget of ``spec`` holds, as RunConfig takes it: a multiselect's picks as the comma list (none
    picked: the default), a text through the field's own parser (blank: the default where that is none or an
    empty list)."""
    if isinstance(held, list):
        return ",".join(held) or spec.default
    if isinstance(held, str) and spec.kind is str:
        if not held.strip() and spec.default in (None, ()):
            return spec.default
        return spec.parse(held) if spec.parse is not None else held
    return held


def field_widget(spec: Field, value: Any, **overrides: Any) -> Any:
    """Draw ``spec``'s widget showing ``value`` and return what it holds, as RunConfig takes it."""
    kind, kwargs = widget_spec(spec, value, **overrides)
    return config_value(spec, getattr(st, kind)(**kwargs))


def form_sections(catalogue: Mapping[str, Field] | None = None) -> list[tuple[Section, list[Field]]]:
    """Every section the catalogue's fields name, in SECTIONS' order and then the order new ones first appear,
    each with its fields in catalogue order."""
    catalogue = FIELDS if catalogue is None else catalogue
    known = {section.title: section for section in SECTIONS}
    named = list(dict.fromkeys(spec.section for spec in catalogue.values() if spec.section is not None))
    ordered = [known[title] for title in known if title in named]
    ordered += [Section(title) for title in named if title not in known]
    return [(section, [spec for spec in catalogue.values() if spec.section == section.title]) for section in ordered]


def is_shown(spec: Field, form: Mapping[str, Any]) -> bool:
    return spec.shown_when is None or bool(spec.shown_when(form))


def draw_form(start: Any, values: dict[str, Any], slots: dict[str, Any], *, form: Mapping[str, Any],
              renderers: Mapping[str, Renderer], extras: Mapping[str, Sequence[Callable[[], None]]] | None = None,
              after: Mapping[str, Callable[[], None]] | None = None) -> dict[str, Any]:
    """Draw every section of the form (``form_sections``): a heading or an expander each, two half sections side
    by side, then ``after[title]`` once the section (or the pair it closes) is drawn. Returns every group's spot
    for a caption below it (``draw_fields``)."""
    ends: dict[str, Any] = {}
    sections = form_sections()
    index = 0
    while index < len(sections):
        section, fields = sections[index]
        pair = sections[index:index + 2] if section.half else [sections[index]]
        if section.half and len(pair) == 2 and pair[1][0].half:
            for column, (half, half_fields) in zip(st.columns(2, gap="large"), pair):
                with column:
                    ends |= _draw_section(half, half_fields, start, values, slots, form, renderers, extras)
        else:
            pair = pair[:1]
            ends |= _draw_section(section, fields, start, values, slots, form, renderers, extras)
        index += len(pair)
        hook = (after or {}).get(pair[-1][0].title)
        if hook is not None:
            hook()
    return ends


def _draw_section(section: Section, fields: list[Field], start: Any, values: dict[str, Any], slots: dict[str, Any],
                  form: Mapping[str, Any], renderers: Mapping[str, Renderer],
                  extras: Mapping[str, Sequence[Callable[[], None]]] | None) -> dict[str, Any]:
    if section.expander:
        with st.expander(section.title):
            return draw_fields(section, fields, start, values, slots, form=form, renderers=renderers,
                               extra=(extras or {}).get(section.title, ()))
    st.subheader(section.title)
    return draw_fields(section, fields, start, values, slots, form=form, renderers=renderers,
                       extra=(extras or {}).get(section.title, ()))


def draw_fields(section: Section, fields: list[Field], start: Any, values: dict[str, Any], slots: dict[str, Any],
                *, form: Mapping[str, Any], renderers: Mapping[str, Renderer],
                extra: Sequence[Callable[[], None]] = ()) -> dict[str, Any]:
    """Draw a section's fields where the page is now: each shown field's widget (or its renderer's), an empty
    spot under it for its error (``slots``), its value into ``values``; under each group's heading, row by row.
    ``form`` is what ``shown_when`` reads (``values`` as they fill, then the started config). ``extra``
    draws what is not a field in the cells after the fields (the note beside the tags). Returns, per group
    (the section's title for fields without one), an empty spot below its last row (a caption about them)."""
    ends: dict[str, Any] = {}
    groups = list(dict.fromkeys(spec.group for spec in fields))
    for group in groups:
        if group is not None:
            st.markdown(f"**{group}**")
        cells: list[tuple[Callable[[], None], bool]] = []
        for spec in fields:
            # Whether it is shown is asked as the cells are drawn: a field may follow the one it depends on.
            if spec.group == group:
                cells.append((lambda spec=spec: _draw_one(spec, start, values, slots, renderers, form),
                              spec.kind is bool and is_shown(spec, form)))
        if group == groups[-1]:
            cells += [(cell, False) for cell in extra]
        _draw_rows(section.columns, cells)
        ends[group or section.title] = st.empty()
    return ends


def _draw_one(spec: Field, start: Any, values: dict[str, Any], slots: dict[str, Any],
              renderers: Mapping[str, Renderer], form: Mapping[str, Any]) -> None:
    if not is_shown(spec, form):
        return
    value = getattr(start, spec.name, spec.default)
    values[spec.name] = (renderers[spec.name] if spec.name in renderers else field_widget)(spec, value)
    slots[spec.name] = st.empty()


def _draw_rows(columns: int | tuple[int, ...], cells: list[tuple[Callable[[], None], bool]]) -> None:
    """Cells row by row, ``columns`` to a row; a single column draws them one under the other. A row holding a
    checkbox aligns its widgets' bottoms, so that the box sits level with the inputs beside it."""
    count = columns if isinstance(columns, int) else len(columns)
    if count == 1:
        for cell, _ in cells:
            cell()
        return
    for first in range(0, len(cells), count):
        row = cells[first:first + count]
        spots = st.columns(columns, vertical_alignment="bottom" if any(switch for _, switch in row) else "top")
        for spot, (cell, _) in zip(spots, row):
            with spot:
                cell()

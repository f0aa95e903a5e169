"""The Run page's notes, in one place below its numbers: what Parallax said about the run (AMP, the
validation split, energy, the memory breakdown on CPU), why a figure is missing, and what this version
knows of a run a newer one recorded. Each is said once, on a line of its own, however many times it
was recorded (a resumed run records its notes again) or however many views found it.

    notes = distinct_notes(run.notes, [mfu_reason], extra_view_notes)
    show_notes(notes, warnings=[nonfinite])     # a collapsed "Notes (n)"; warnings stay in sight
"""

from __future__ import annotations

from collections.abc import Iterable

import streamlit as st

from ui.text import escape_markdown

NOTES_LABEL = "Notes"


def distinct_notes(*groups: Iterable[str | None]) -> list[str]:
    """The lines of ``groups`` in order, each once (lines that differ only in spacing are one), empty ones left out."""
    seen: set[str] = set()
    lines = []
    for group in groups:
        for line in group:
            text = " ".join((line or "").split())
            if text and text not in seen:
                seen.add(text)
                lines.append(text)
    return lines


def notes_label(count: int) -> str:
    return f"{NOTES_LABEL} ({count})"


def show_notes(lines: list[str], warnings: Iterable[str | None] = (), *, expanded: bool = False) -> None:
    """The warnings (things that went wrong while the run trained) in sight, then the notes in one
    section, collapsed unless ``expanded`` (a failed run's notes may say why): a page that leads with
    the run's numbers, not with what Parallax chose for it. A paragraph per note, each as written."""
    for warning in distinct_notes(warnings):
        st.warning(escape_markdown(warning), icon=":material/warning:")
    if lines:
        # A key: a reader's open section stays open when a new note changes its label.
        with st.expander(notes_label(len(lines)), expanded=expanded, icon=":material/info:", key="run_notes_list"):
            for line in lines:
                st.markdown(escape_markdown(line))

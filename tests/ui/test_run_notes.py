"""The Run page's notes: each said once, in the order first said, however many times it was recorded.

    .venv/bin/python -m pytest tests/ui/test_run_notes.py -q
"""

from __future__ import annotations

from ui.run_notes import distinct_notes, notes_label

ENERGY = "Energy per image is not recorded (no estimate is shown instead): cpu_package: RAPL is not available."


def test_a_note_recorded_twice_is_said_once_in_the_order_first_said():
    recorded = ["DDP on CPU: 2 processes on gloo.", ENERGY, "AMP auto: CPU runs train in fp32."]
    resumed = recorded + [ENERGY.replace(" (", "  (")]  # a resumed run records its notes again
    assert distinct_notes(resumed, [None, "", "MFU: not recorded.", ENERGY]) == [*recorded, "MFU: not recorded."]


def test_the_label_counts_the_notes():
    assert notes_label(6) == "Notes (6)"

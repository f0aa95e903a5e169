"""CSV files users open in a spreadsheet, made safe: a spreadsheet runs a cell that starts with
``=``, ``+``, ``-`` or ``@`` as a formula (OWASP "CSV injection"), and op, tag and dataset names are
text users control.

    frame_for_csv(frame).to_csv(index=False)         # no cell starts a spreadsheet formula
"""

from __future__ import annotations

import pandas as pd

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """A text cell a spreadsheet would run as a formula gets a leading quote; numbers stay numbers."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not _is_number(value):
        return "'" + value
    return value


def frame_for_csv(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` whose text cells (and column names) cannot start a formula."""
    safe = frame.copy()
    safe.columns = [csv_cell(c) for c in safe.columns]
    for column in safe.columns:
        if safe[column].dtype == object or pd.api.types.is_string_dtype(safe[column]):
            safe[column] = safe[column].map(csv_cell)
    return safe


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True

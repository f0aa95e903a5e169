"""What the browser tests share: Playwright's assertions wait as long as a busy machine needs."""

from __future__ import annotations

import pytest

# Playwright's default of 5 s fits a redraw on an idle machine; on two cores running the whole suite,
# a server's rerun can take longer. A failing assertion still fails, only later.
EXPECT_MS = 15_000


@pytest.fixture(autouse=True)
def patient_expect():
    try:
        from playwright.sync_api import expect
    except ImportError:  # the browser tests say so themselves, and fail
        yield
        return
    expect.set_options(timeout=EXPECT_MS)
    yield
    expect.set_options(timeout=None)  # Playwright's default again, for the tests elsewhere in this process

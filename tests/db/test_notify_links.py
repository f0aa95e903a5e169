"""Where the links in webhook messages point: PARALLAX_DASHBOARD_URL, else the address the home's dashboard was
last started on, else the default; a hook is shown by scheme, host and port, never its path.

    .venv/bin/python -m pytest tests/db/test_notify_links.py -q
"""

from __future__ import annotations

import pytest

from db import notify


def test_links_follow_the_variable_then_the_recorded_address_then_the_default(parallax_home, monkeypatch):
    monkeypatch.delenv(notify.DASHBOARD_URL_ENV, raising=False)
    assert notify.dashboard_url()[0] == notify.DEFAULT_DASHBOARD_URL
    notify.record_dashboard_url("http://lab-box.example:8600/dash")
    assert notify.dashboard_url()[0] == "http://lab-box.example:8600/dash"
    monkeypatch.setenv(notify.DASHBOARD_URL_ENV, "https://parallax.lab.example/")
    assert notify.dashboard_url() == ("https://parallax.lab.example", notify.DASHBOARD_URL_ENV)


def test_a_recorded_address_that_is_not_a_url_is_not_linked(parallax_home, monkeypatch):
    monkeypatch.delenv(notify.DASHBOARD_URL_ENV, raising=False)
    (parallax_home / notify.DASHBOARD_URL_FILE).write_text("javascript:alert(1)\n")
    assert notify.dashboard_url()[0] == notify.DEFAULT_DASHBOARD_URL


@pytest.mark.parametrize("url, shown", [
    ("http://127.0.0.1:9000/hooks/T0/SECRET", "http://127.0.0.1:9000/…"),
    ("https://hooks.slack.com/services/T0/B0/SECRET", "https://hooks.slack.com/…"),
    ("http://[::1]:8080/x/SECRET", "http://[::1]:8080/…"),
    ("http://user:pw@example.org:99999/SECRET", "http://example.org/…"),
])
def test_a_hook_is_shown_with_its_port_and_without_its_secret(url, shown):
    assert notify.shown_url(url) == shown

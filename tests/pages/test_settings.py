"""The Settings page: the home's webhooks, kept in a file only its owner reads, shown by host, checked
before they are saved, and a test message a real receiver on 127.0.0.1 takes.

    .venv/bin/python -m pytest tests/pages/test_settings.py -q
"""

from __future__ import annotations

import stat

from streamlit.testing.v1 import AppTest

from tests.db.test_notify import SECRET, Receiver
from tests.support import ROOT
from db import notify

APP = str(ROOT / "app.py")


def settings_page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    return at.switch_page("pages/settings.py").run()


def test_saved_webhooks_are_private_shown_by_host_and_take_a_test_message(parallax_home, monkeypatch):
    monkeypatch.delenv(notify.WEBHOOKS_ENV, raising=False)
    receiver = Receiver()
    try:
        at = settings_page()
        assert not at.exception, at.exception
        at.text_area[0].input(receiver.url)
        at.button[0].click().run()
        path = parallax_home / notify.WEBHOOKS_FILE
        assert path.read_text() == receiver.url + "\n"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        shown = " ".join(m.value for m in at.markdown)
        port = receiver.server.server_address[1]  # not the default: a hook is shown with the port it posts to
        assert f"Kept here: `http://127.0.0.1:{port}/…`" in shown and SECRET not in shown
        [send] = [b for b in at.button if b.label == "Send a test message"]
        send.click().run()
        assert [s.value for s in at.success] == [f"http://127.0.0.1:{port}/… took it"]
        assert receiver.posts[0]["body"]["event"] == "test"
    finally:
        receiver.close()


def test_a_webhook_that_is_not_a_url_is_refused_and_nothing_is_saved(parallax_home):
    at = settings_page()
    at.text_area[0].input("https://ok.example/1\nslack-webhook-here")
    at.button[0].click().run()
    assert [e.value.replace("\u2060", "") for e in at.error] == ["webhook '(not a URL)' is not allowed: give an http:// or https:// URL "
                                           "with a host"]
    assert not (parallax_home / notify.WEBHOOKS_FILE).exists()

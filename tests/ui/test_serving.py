"""The dashboard as ``make run`` serves it: framing refused, a login cookie that outlasts a reload,
checkpoints streamed from disk, and the same command for tests, benchmarks and users.

One real ``streamlit run app.py`` (started as ``make run`` starts it, with a password and a secrets
file) and chromium for the module; a finished run holds a 256 MB (sparse) checkpoint.

    .venv/bin/python -m pytest tests/ui/test_serving.py -q
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest

from bench.browser import CHROMIUM, CHROMIUM_ARGS, free_port, make_run_command, start_dashboard
from tests.support import ROOT
from db import dispose_engines, make_engine, store
from db.folders import run_folder
from ui import auth, login_cookie

PASSWORD = "correct horse"
PASSWORD_HASH = auth.hash_password(PASSWORD)
COOKIE_SECRET = "a" * 64
LOGIN_DAYS = 2
CHECKPOINT_BYTES = 256 * 2**20
UI_MS = 60_000


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    home = tmp_path_factory.mktemp("serving")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PARALLAX_HOME", str(home))
        patch.delenv("PARALLAX_DB_URL", raising=False)
        engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
        run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "single",
                                           "devices": ["cpu"], "epochs": 1, "tags": []}, status="completed")
        with open(run_folder(engine, run_id, create=True) / "best.pt", "wb") as checkpoint:
            checkpoint.truncate(CHECKPOINT_BYTES)  # sparse: costs no disk, reads as zeros
        dispose_engines()
    secrets = home / "secrets.toml"
    secrets.write_text(f'[parallax]\npassword_hash = "{PASSWORD_HASH}"\ncookie_secret = "{COOKIE_SECRET}"\n'
                       f"login_days = {LOGIN_DAYS}\n")
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("PARALLAX_DB_URL", None)
    server = start_dashboard(env, log=home / "streamlit.log", extra_args=["--secrets.files", str(secrets)])
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                yield server, browser, run_id
            finally:
                browser.close()
    finally:
        server.stop(grace_s=15)


def token(secret: str = COOKIE_SECRET, *, lifetime_s: float = 3600, now: float | None = None) -> str:
    return login_cookie.make_token(login_cookie.signing_key(secret, PASSWORD_HASH), lifetime_s, now=now)


def with_cookie(browser, url: str, value: str):
    context = browser.new_context()
    context.add_cookies([{"name": login_cookie.COOKIE_NAME, "value": value, "url": url}])
    return context


def login_cookie_of(context) -> dict | None:
    return next((c for c in context.cookies() if c["name"] == login_cookie.COOKIE_NAME), None)


def test_benchmarks_and_tests_start_the_dashboard_as_make_run_does():
    printed = subprocess.run(["make", "-n", "-C", str(ROOT), "run", "-o", ".venv/.installed", "PORT=8123",
                              "ADDRESS=127.0.0.1"], capture_output=True, text=True, timeout=30)
    assert printed.returncode == 0, printed.stderr
    [line] = [line for line in printed.stdout.splitlines() if "parallax ui" in line]
    assert line.split()[0].endswith("/parallax") and line.split()[1:] == make_run_command("127.0.0.1", 8123)[3:]
    # The serving settings are the project's own config, beside app.py, where Streamlit reads it.
    config = (ROOT / ".streamlit" / "config.toml").read_text()
    assert 'fileWatcherType = "none"' in config and "runOnSave = false" in config


def test_no_other_site_can_frame_the_dashboard(served):
    """A page on another origin frames the dashboard: chromium must not render it (a control frame of
    the other site's own page renders, so the check can see a frame that does)."""
    from playwright.sync_api import expect

    server, browser, _ = served
    with urllib.request.urlopen(f"{server.url}/", timeout=10) as response:
        assert response.headers["X-Frame-Options"] == "DENY"
        assert response.headers["Content-Security-Policy"] == "frame-ancestors 'none'"

    class Framing(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = (b"<p>inner page</p>" if self.path == "/inner" else
                    f'<iframe id="own" src="/inner"></iframe><iframe id="dash" src="{server.url}/runs"></iframe>'
                    .encode())
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    other = ThreadingHTTPServer(("127.0.0.1", free_port()), Framing)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        page = browser.new_page()
        page.goto(f"http://localhost:{other.server_address[1]}/")  # another origin: host and port differ
        expect(page.frame_locator("#own").get_by_text("inner page")).to_be_visible(timeout=10_000)
        page.wait_for_timeout(3000)
        framed = page.frame_locator("#dash")
        assert framed.locator("input[type=password]").count() == 0
        assert framed.get_by_text("Parallax").count() == 0
        [dash] = [f for f in page.frames if f.name == "" and f != page.main_frame and "inner" not in f.url]
        assert not dash.url.startswith(server.url), dash.url  # chromium's error page instead
        page.close()
    finally:
        other.shutdown()
        other.server_close()


def test_a_login_lasts_across_reloads_and_tabs_until_logged_out(served):
    from playwright.sync_api import expect

    server, browser, _ = served
    # A bookmarked page (lighter than Launch's form): the password is asked there, and the page opens after it.
    on_runs = f"{server.url}/runs"

    def log_in(context):
        page = context.new_page()
        page.goto(on_runs)
        page.get_by_label("Password", exact=True).fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible(timeout=UI_MS)
        deadline = time.monotonic() + 15
        while (cookie := login_cookie_of(context)) is None:
            assert time.monotonic() < deadline, "the page never got its login cookie"
            page.wait_for_timeout(200)
        return page, cookie

    def log_out(context, page) -> None:
        page.get_by_role("button", name="Log out").click()
        expect(page.get_by_label("Password", exact=True)).to_be_visible(timeout=UI_MS)
        deadline = time.monotonic() + 15
        while login_cookie_of(context) is not None:
            assert time.monotonic() < deadline, "logging out left the cookie in the browser"
            page.wait_for_timeout(200)

    # Logged out in the very session that logged in (its websocket never saw the cookie). It logs in on a
    # bookmarked page as the server's first session, which enters the page through app.py and then reopens
    # it (ui.state.enter_through_app): the cookie still reaches the browser (was: the reopening dropped the
    # script that trades the login's ticket for it).
    brief = browser.new_context()
    log_out(brief, log_in(brief)[0])
    brief.close()
    # Later sessions, after app.py has run in the server, get the password on the page too (was: Streamlit's
    # "Page not found" dialog over it, then Launch).

    context = browser.new_context()
    page, cookie = log_in(context)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    assert abs(cookie["expires"] - (time.time() + LOGIN_DAYS * 86400)) < 120
    assert page.evaluate("document.cookie").find(login_cookie.COOKIE_NAME) == -1  # no script can read it

    page.reload()
    expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible(timeout=UI_MS)
    other_tab = context.new_page()
    other_tab.goto(f"{server.url}/compare")
    expect(other_tab.get_by_role("heading", name="Compare runs")).to_be_visible(timeout=UI_MS)
    expect(other_tab.get_by_label("Password", exact=True)).to_have_count(0)

    # Cookies the server did not make, or made for a login that is over, get the password form.
    for value in (token("b" * 64), token(now=time.time() - 7200), token(lifetime_s=LOGIN_DAYS * 86400 * 10),
                  cookie["value"][:-1] + ("0" if cookie["value"][-1] != "0" else "1")):
        refused = with_cookie(browser, server.url, value)
        tab = refused.new_page()
        tab.goto(on_runs)
        expect(tab.get_by_label("Password", exact=True)).to_be_visible(timeout=UI_MS)
        expect(tab.get_by_role("heading", name="Runs", exact=True)).to_have_count(0)
        expect(tab.get_by_role("dialog")).to_have_count(0)
        refused.close()
    # ... while one signed with the secret in secrets.toml is taken: the refusals above are about the cookie.
    accepted = with_cookie(browser, server.url, token())
    tab = accepted.new_page()
    tab.goto(on_runs)
    expect(tab.get_by_role("heading", name="Runs", exact=True)).to_be_visible(timeout=UI_MS)
    accepted.close()

    log_out(context, page)
    fresh = context.new_page()
    fresh.goto(on_runs)
    expect(fresh.get_by_label("Password", exact=True)).to_be_visible(timeout=UI_MS)
    # The logged-out cookie, kept by someone and sent again, is refused too.
    replayed = with_cookie(browser, server.url, cookie["value"])
    tab = replayed.new_page()
    tab.goto(on_runs)
    expect(tab.get_by_label("Password", exact=True)).to_be_visible(timeout=UI_MS)
    replayed.close()
    context.close()


def test_the_checkpoint_is_streamed_from_disk(served):
    """The Run page's link downloads the whole checkpoint while the server's memory stays well below
    its size; a link changed in any part is refused."""
    from playwright.sync_api import expect

    server, browser, run_id = served
    context = with_cookie(browser, server.url, token())
    page = context.new_page()
    page.goto(f"{server.url}/run?run={run_id}")
    link = page.get_by_role("link", name=re.compile("Download the best checkpoint"))
    expect(link).to_be_visible(timeout=UI_MS)
    expect(link).to_contain_text("256.0 MB")
    href = link.get_attribute("href")
    context.close()
    url = f"{server.url}{href}" if href.startswith("/") else href

    process = psutil.Process(server.process.pid)
    before_mb = process.memory_info().rss / 2**20
    received, peak_mb = 0, before_mb
    # As a browser asks: gzip accepted. A checkpoint is sent as it is, not compressed on the fly.
    as_a_browser = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(as_a_browser, timeout=60) as response:
        assert response.headers.get("Content-Encoding") is None
        assert response.headers["Content-Disposition"] == f'attachment; filename="parallax-run-{run_id}-best.pt"'
        assert int(response.headers["Content-Length"]) == CHECKPOINT_BYTES
        while chunk := response.read(4 * 2**20):
            received += len(chunk)
            peak_mb = max(peak_mb, process.memory_info().rss / 2**20)
    assert received == CHECKPOINT_BYTES
    assert peak_mb - before_mb < 64, (before_mb, peak_mb)  # read whole, it would grow by 256 MB

    other_run = re.sub(r"/download/\d+/", f"/download/{run_id + 1}/", url)
    for bad in (url.replace("sig=", "sig=0"), url[:-1] + ("0" if url[-1] != "0" else "1"), other_run,
                url.replace("best.pt", "run.log"), re.sub(r"expires=\d+", "expires=1", url)):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(bad, timeout=10)
        assert refused.value.code == 403, bad


def test_a_sent_comparison_opens_with_its_runs_and_says_what_it_cannot_show(served):
    """A colleague's link, opened in a fresh browser: the runs in it that exist are picked, the one that
    does not is named, and the address then says what is shown."""
    from playwright.sync_api import expect

    server, browser, run_id = served
    context = with_cookie(browser, server.url, token())
    page = context.new_page()
    page.goto(f"{server.url}/compare?runs={run_id},999")
    expect(page.get_by_text("Run #999 in the address does not exist")).to_be_visible(timeout=UI_MS)
    expect(page.get_by_test_id("stMultiSelect").get_by_text(f"#{run_id}")).to_be_visible()
    page.wait_for_url(re.compile(rf"[?&]runs={run_id}$"), timeout=10_000)
    context.close()


def test_a_login_token_is_refused_when_forged_expired_or_reused_as_a_ticket():
    key, now = login_cookie.signing_key(COOKIE_SECRET, PASSWORD_HASH), 1_000_000.0
    good = login_cookie.make_token(key, 3600, now=now)
    assert login_cookie.read_token(good, key, 3600, now=now + 10) is not None
    assert login_cookie.read_token(good, key, 3600, now=now + 3601) is None  # expired
    assert login_cookie.read_token(good, key, 60, now=now) is None  # made before login_days was shortened
    assert login_cookie.read_token(good, login_cookie.signing_key("b" * 64, PASSWORD_HASH), 3600, now=now) is None
    assert login_cookie.read_token(good, login_cookie.signing_key(COOKIE_SECRET, auth.hash_password("another")),
                                   3600, now=now) is None  # the password changed
    for bad in (None, 5, "", "v1.x.y.z", good.replace("v1.", "v2.", 1), good + "0", "v1." * 100):
        assert login_cookie.read_token(bad, key, 3600, now=now) is None
    clock = [now]
    book = login_cookie.LoginBook(clock=lambda: clock[0])
    ticket = book.issue_ticket(good, 3600)
    assert book.pending(ticket) and not book.pending("guess") and not book.pending(None)
    assert book.redeem(ticket) == (good, 3600) and book.redeem(ticket) is None  # once
    assert not book.pending(ticket)
    late = book.issue_ticket(good, 3600)
    clock[0] += login_cookie.TICKET_TTL_S + 1
    assert not book.pending(late)
    assert book.redeem(late) is None and book.redeem("guess") is None
    login = login_cookie.read_token(good, key, 3600, now=now)
    book.revoke(login)
    assert book.revoked(login)


@pytest.mark.parametrize("value, ok", [(7, True), (0.5, True), (0, False), (-1, False), (400, False),
                                       ("7", False), (True, False)])
def test_login_days_must_be_a_number_of_days(value, ok):
    secrets = {"parallax": {"login_days": value}}
    if ok:
        assert login_cookie.login_days(secrets) == value
    else:
        with pytest.raises(ValueError, match=rf"\[parallax\] login_days = {re.escape(repr(value))} in secrets.toml"):
            login_cookie.login_days(secrets)
    assert login_cookie.login_days({}) == login_cookie.DEFAULT_LOGIN_DAYS


def test_a_bad_login_days_stops_the_dashboard_with_one_line(parallax_home):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90)
    at.secrets["parallax"] = {"password_hash": PASSWORD_HASH, "login_days": "forever"}
    at.run()
    from ui.text import escape_markdown

    assert [e.value for e in at.error] == [escape_markdown(
        "[parallax] login_days = 'forever' in secrets.toml: it must be a number of days above 0 and at most 366, "
        "e.g. login_days = 7")]
    assert not at.text_input

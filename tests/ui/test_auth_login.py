"""Who may reach the dashboard: the Host check (DNS rebinding), a login that applies on loopback
too, the OIDC allow-list, and throttled, logged password guessing.

The Host check and the throttle shared by every session of a client run against a real
``streamlit run app.py`` seen by chromium, with ``--host-resolver-rules`` resolving a foreign name
to 127.0.0.1 as a rebinding attacker's DNS would. AppTest cannot send request headers, so the
rest goes through the decision functions and AppTest.

    .venv/bin/python -m pytest tests/ui/test_auth_login.py -q
"""

from __future__ import annotations

import logging
import os

import pytest
import streamlit.config as streamlit_config
from streamlit.testing.v1 import AppTest

from tests.support import GATED, ROOT
from ui import auth
from ui.text import escape_markdown
from ui.throttle import LoginThrottle

APP = str(ROOT / "app.py")
TIMEOUT_S = 90
PASSWORD = "correct horse"


# --- the Host check -----------------------------------------------------------------------------


@pytest.mark.parametrize("host, allowed, bound, ok", [
    ("localhost:8501", [], "127.0.0.1", True),
    ("127.0.0.1:8501", [], "127.0.0.1", True),
    ("127.0.0.1", [], "127.0.0.1", True),
    ("[::1]:8501", [], "::1", True),
    ("LocalHost.:8501", [], "127.0.0.1", True),
    ("evil.example:8501", [], "127.0.0.1", False),  # a rebinding name that resolves to 127.0.0.1
    ("localhost.evil.example", [], "127.0.0.1", False),
    ("127.0.0.1.nip.io:8501", [], "127.0.0.1", False),
    ("dash.example.org:443", ["dash.example.org"], "0.0.0.0", True),
    ("other.example.org", ["dash.example.org"], "0.0.0.0", False),
    ("10.0.0.5:8501", [], "10.0.0.5", True),  # the address the server is bound to
    ("10.0.0.6:8501", [], "10.0.0.5", False),
    ("0.0.0.0:8501", [], "0.0.0.0", False),  # "every interface" is not a name anyone asks for
    (None, [], "127.0.0.1", False),
    ("", [], "127.0.0.1", False),
    ("evil.example:8501@localhost", [], "127.0.0.1", False),
    ("a b", [], "127.0.0.1", False),
])
def test_the_dashboard_answers_only_to_its_own_host_names(host, allowed, bound, ok):
    assert auth.host_allowed(host, allowed, bound) is ok


def test_allowed_hosts_come_from_the_secrets_and_the_environment():
    secrets = {"parallax": {"allowed_hosts": ["Dash.Example.org", "gpu-box:8501"]}}
    assert auth.allowed_hosts(secrets, {}) == ["dash.example.org", "gpu-box"]
    assert auth.allowed_hosts({"parallax": {"allowed_hosts": "a.org, b.org"}}, {}) == ["a.org", "b.org"]
    assert auth.allowed_hosts({}, {auth.ALLOWED_HOSTS_ENV: "c.org,d.org:80"}) == ["c.org", "d.org"]
    assert auth.allowed_hosts({"parallax": {"allowed_hosts": 5}}, {}) == []


# --- a configured login applies on loopback too -------------------------------------------------


@pytest.fixture
def bound_to(request):
    before = streamlit_config.get_option("server.address")
    streamlit_config.set_option("server.address", request.param)
    yield request.param
    streamlit_config.set_option("server.address", before)


@pytest.fixture
def fresh_throttle(monkeypatch):
    """A throttle of this test's own: the server-wide one would carry counts between tests."""
    throttle = LoginThrottle()
    monkeypatch.setattr(auth, "THROTTLE", throttle)
    return throttle


def titles(at: AppTest) -> list[str]:
    return [t.value for t in at.title]


@pytest.mark.parametrize("bound_to", ["127.0.0.1"], indirect=True)
def test_a_configured_password_applies_on_loopback_too(bound_to, parallax_home, fresh_throttle):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.secrets["parallax"] = {"password_hash": auth.hash_password(PASSWORD)}
    at.run()
    assert titles(at) == ["Parallax"] and [t.label for t in at.text_input] == ["Password"]
    with pytest.raises(ValueError, match=GATED):
        at.switch_page("pages/runs.py")


# --- OIDC: an allow-list ------------------------------------------------------------------------

ALLOW = {"parallax": {"allowed_emails": ["Ada@Lab.example"], "allowed_domains": ["team.example"]}}


@pytest.mark.parametrize("user, secrets, words", [
    ({"email": "ada@lab.example"}, ALLOW, None),
    ({"email": "bob@team.example", "email_verified": True}, ALLOW, None),
    ({"email": "mallory@evil.example"}, ALLOW, "mallory@evil.example may not use this dashboard"),
    ({"email": "eve@sub.team.example"}, ALLOW, "may not use this dashboard"),  # subdomains only if listed
    ({"email": "eve@evilteam.example"}, ALLOW, "may not use this dashboard"),
    ({"email": "bob@team.example", "email_verified": False}, ALLOW, "has not verified"),
    ({"email": None}, ALLOW, "sent no e-mail address"),
    ({"email": "a@b@team.example"}, ALLOW, "sent no e-mail address"),
    ({"email": "ada@lab.example"}, {}, "No one may use this dashboard yet"),
])
def test_oidc_lets_in_only_the_listed_emails_and_domains(user, secrets, words):
    refusal = auth.oidc_refusal(user, secrets)
    assert (refusal is None) if words is None else (words in refusal)


OIDC_SECRETS = {"redirect_uri": "http://127.0.0.1:8501/oauth2callback", "cookie_secret": "x" * 32,
                "client_id": "parallax", "client_secret": "s",
                "server_metadata_url": "https://id.example.org/.well-known/openid-configuration"}


@pytest.mark.parametrize("email, allowed", [("mallory@evil.example", False), ("ada@lab.example", True)])
def test_a_logged_in_oidc_user_off_the_list_gets_no_page(email, allowed, parallax_home, caplog):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.secrets["auth"] = OIDC_SECRETS
    at.secrets["parallax"] = ALLOW["parallax"]
    at.user = {"is_logged_in": True, "email": email}
    with caplog.at_level(logging.WARNING, logger="parallax.auth"):
        at.run()
    assert not at.exception
    if allowed:
        assert titles(at) == ["Launch a run"] and not at.error
        return
    assert titles(at) == ["Parallax"]
    assert [e.value for e in at.error] == [escape_markdown(f"{email} may not use this dashboard. Ask its owner to add "
                                                          "you, then log in again.")]
    assert [b.label for b in at.button] == ["Log out"]
    with pytest.raises(ValueError, match=GATED):
        at.switch_page("pages/runs.py")
    assert any(email in r.getMessage() for r in caplog.records)


# --- password guessing --------------------------------------------------------------------------


def test_the_throttle_waits_longer_after_each_wrong_password_and_forgets_the_oldest():
    now = [1000.0]
    throttle = LoginThrottle(free_tries=3, max_wait_s=300, max_clients=3, clock=lambda: now[0])
    assert [throttle.failed("client:a") for _ in range(3)] == [0.0, 0.0, 1.0]
    assert throttle.wait_s("client:a") == 1.0 and throttle.wait_s("client:b") == 0.0
    now[0] += 1.0
    assert throttle.wait_s("client:a") == 0.0
    assert [throttle.failed("client:a") for _ in range(10)][-3:] == [256.0, 300.0, 300.0]  # capped
    throttle.succeeded("client:a")
    assert throttle.wait_s("client:a") == 0.0 and throttle.failures("client:a") == 0
    for key in ("k1", "k2", "k3", "k4"):
        throttle.failed(key)
    assert len(throttle) == 3 and throttle.failures("k1") == 0  # bounded: the oldest is forgotten


def test_a_try_counts_against_its_session_and_its_client():
    assert auth.throttle_keys("s1", "10.0.0.5") == ["session:s1", "client:10.0.0.5"]
    assert auth.throttle_keys("s1", None) == ["session:s1"]


@pytest.mark.parametrize("bound_to", ["0.0.0.0"], indirect=True)
def test_wrong_passwords_are_throttled_and_logged_without_the_password(bound_to, parallax_home, caplog, monkeypatch):
    now = [1000.0]  # the throttle's clock, so that no wait depends on how fast this machine is
    monkeypatch.setattr(auth, "THROTTLE", LoginThrottle(clock=lambda: now[0]))
    checks = []
    real_verify = auth.verify_password
    monkeypatch.setattr(auth, "verify_password", lambda *a: checks.append(1) or real_verify(*a))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.secrets["parallax"] = {"password_hash": auth.hash_password(PASSWORD)}
    at.run()

    def log_in(password: str) -> list[str]:
        at.text_input[0].input(password)
        at.button[0].click().run()
        return [e.value for e in at.error]

    with caplog.at_level(logging.WARNING, logger="parallax.auth"):
        assert log_in("guess-1") == ["Wrong password."]
        assert log_in("guess-2") == ["Wrong password (2 in a row)."]
        assert log_in("guess-3") == ["Wrong password (3 in a row). Wait 1 s before the next try."]
        now[0] += 0.5
        # Within the wait even the right password is refused, and scrypt does not run for it.
        assert log_in(PASSWORD) == ["Too many wrong passwords: try again in 1 s."]
    assert len(checks) == 3 and titles(at) == ["Parallax"]
    messages = [r.getMessage() for r in caplog.records if r.name == "parallax.auth"]
    assert messages[:3] == [f"wrong password from client unknown ({n} in a row)" for n in (1, 2, 3)]
    assert messages[3] == "login refused for client unknown: 3 wrong passwords in a row, next try in 1 s"
    assert not any("guess" in m or PASSWORD in m for m in messages)
    now[0] += 0.6
    assert log_in(PASSWORD) == [] and titles(at) == ["Launch a run"]


# --- a real server, a real browser --------------------------------------------------------------


def test_a_forged_host_is_refused_and_guessing_is_throttled_per_client_in_a_real_browser(tmp_path):
    """``streamlit run app.py`` on 127.0.0.1 with a password and one allowed host; chromium resolves
    evil.example and dash.internal to 127.0.0.1."""
    from playwright.sync_api import expect, sync_playwright
    from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard

    log = tmp_path / "streamlit.log"
    secrets = tmp_path / "secrets.toml"
    secrets.write_text(f'[parallax]\npassword_hash = "{auth.hash_password(PASSWORD)}"\n')
    env = {**os.environ, "PARALLAX_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1",
           auth.ALLOWED_HOSTS_ENV: "dash.internal"}
    server = start_dashboard(env, log=log, extra_args=["--secrets.files", str(secrets)])
    port = server.url.rsplit(":", 1)[1]
    try:
        rules = "MAP evil.example 127.0.0.1, MAP dash.internal 127.0.0.1"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                                 args=[*CHROMIUM_ARGS, f"--host-resolver-rules={rules}"])
            try:
                page = browser.new_page()
                page.goto(f"http://evil.example:{port}/runs")
                refusal = page.get_by_test_id("stAlert").filter(has_text="does not answer to the host name")
                expect(refusal).to_be_visible(timeout=30_000)
                expect(refusal).to_contain_text(f"evil.example:{port}")
                expect(page.get_by_label("Password", exact=True)).to_have_count(0)  # not even the login is served
                expect(page.get_by_test_id("stSidebarNav")).to_have_count(0)

                # The names it answers to get the login, on loopback as elsewhere.
                for host in ("dash.internal", "localhost"):
                    other = browser.new_page()
                    other.goto(f"http://{host}:{port}/")
                    expect(other.get_by_label("Password", exact=True)).to_be_visible(timeout=30_000)
                    other.close()

                def wrong_password(tab, attempt: int) -> str:
                    tab.get_by_label("Password", exact=True).fill(f"guess-{attempt}")
                    tab.get_by_role("button", name="Log in").click()
                    said = "Wrong password" + (f" ({attempt} in a row)" if attempt > 1 else ".")
                    alert = tab.get_by_test_id("stAlert").filter(has_text=said)
                    expect(alert).to_be_visible(timeout=30_000)
                    return alert.get_by_test_id("stMarkdownContainer").inner_text().strip()

                first = browser.new_page()
                first.goto(f"http://localhost:{port}/")
                said = []
                for attempt in range(1, 7):  # the waits after the 3rd..6th: 1, 2, 4, 8 s
                    said.append(wrong_password(first, attempt))
                    if attempt < 6 and "Wait" in said[-1]:
                        first.wait_for_timeout(int(said[-1].split("Wait ")[1].split(" s")[0]) * 1000 + 300)
                assert said[-1] == "Wrong password (6 in a row). Wait 8 s before the next try.", said
                # A new session (another tab, no shared cookies) from the same client: still waiting.
                second = browser.new_context().new_page()
                second.goto(f"http://127.0.0.1:{port}/")
                second.get_by_label("Password", exact=True).fill(PASSWORD)
                second.get_by_role("button", name="Log in").click()
                expect(second.get_by_test_id("stAlert").filter(has_text="Too many wrong passwords")).to_be_visible(
                    timeout=30_000)
            finally:
                browser.close()
    finally:
        server.stop(grace_s=15)
    output = log.read_text()
    assert f"refused a request for host 'evil.example:{port}'" in output, output
    assert "wrong password from client 127.0.0.1 (6 in a row)" in output
    assert "login refused for client 127.0.0.1: 6 wrong passwords in a row" in output
    assert "guess-" not in output and PASSWORD not in output


def test_without_a_login_a_request_through_a_proxy_is_refused_in_a_real_browser(tmp_path):
    """Loopback with no login serves this machine's browsers; a local reverse proxy would publish it.
    Chromium sends the header a proxy adds (on the page and its websocket)."""
    from playwright.sync_api import expect, sync_playwright
    from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard

    log = tmp_path / "streamlit.log"
    env = {**os.environ, "PARALLAX_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    server = start_dashboard(env, log=log, extra_args=["--secrets.files", str(tmp_path / "no-secrets.toml")])
    try:
        url = server.url
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                proxied = browser.new_context(extra_http_headers={"X-Forwarded-For": "203.0.113.9"}).new_page()
                proxied.goto(f"{url}/runs")
                refusal = proxied.get_by_test_id("stAlert").filter(has_text="This request came through a proxy")
                expect(refusal).to_be_visible(timeout=30_000)
                expect(proxied.get_by_test_id("stSidebarNav")).to_have_count(0)
                direct = browser.new_page()
                direct.goto(url)
                expect(direct.get_by_role("heading", name="Launch a run")).to_be_visible(timeout=30_000)
            finally:
                browser.close()
    finally:
        server.stop(grace_s=15)
    assert "refused a request forwarded by a proxy (X-Forwarded-For) with no login configured" in log.read_text()


@pytest.mark.parametrize("headers, proxied", [
    ({"X-Forwarded-For": "203.0.113.9"}, True), ({"Forwarded": "for=203.0.113.9"}, True),
    ({"X-Real-Ip": "203.0.113.9"}, True), ({"X-Forwarded-Host": "example.org"}, True),
    ({"Host": "localhost:8501", "User-Agent": "x"}, False),
])
def test_requests_that_name_a_proxy_are_told_apart(headers, proxied):
    from streamlit.runtime.context import StreamlitHeaders

    assert auth.forwarded_by_a_proxy(StreamlitHeaders(list(headers.items()))) is proxied

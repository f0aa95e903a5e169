"""Password guessing from many addresses: an IPv6 client counts by its /64 prefix (a host is given
a whole /64 and may try from a new address every time), and wrong passwords from all clients
together have a budget, so that many addresses neither buy many guesses nor flush the table.

The login runs through AppTest with the real scrypt check; only the client address, which the
network would give, is set by the test.

    .venv/bin/python -m pytest tests/ui/test_throttle.py -q
"""

from __future__ import annotations

import itertools
import logging

import pytest
from streamlit import config as streamlit_config
from streamlit.testing.v1 import AppTest

from tests.support import ROOT
from ui import auth
from ui.throttle import FailureBudget, LoginThrottle, client_key

APP = str(ROOT / "app.py")
TIMEOUT_S = 90
PASSWORD = "correct horse battery"


@pytest.mark.parametrize("address, key", [
    ("2001:db8:1:2:a:b:c:d", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
    ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
    ("fe80::1%eth0", "fe80::/64"),
    ("::ffff:10.0.0.5", "10.0.0.5"),
    ("10.0.0.5", "10.0.0.5"),
    ("not-an-address", "not-an-address"),
])
def test_a_client_is_an_ipv4_address_or_an_ipv6_64(address, key):
    assert client_key(address) == key
    assert auth.throttle_keys("s1", address) == ["session:s1", f"client:{key}"]


def test_the_budget_over_all_clients_refuses_past_its_limit_until_the_window_moves():
    now = [1000.0]
    budget = FailureBudget(limit=3, window_s=60, clock=lambda: now[0])
    for _ in range(3):
        assert budget.wait_s() == 0.0
        budget.failed()
        now[0] += 10
    assert budget.wait_s() == 30.0  # the oldest of the three leaves the window at 1060
    now[0] += 30
    assert budget.wait_s() == 0.0


@pytest.fixture
def on_all_addresses():
    before = streamlit_config.get_option("server.address")
    streamlit_config.set_option("server.address", "0.0.0.0")
    yield
    streamlit_config.set_option("server.address", before)


@pytest.fixture
def login(monkeypatch, parallax_home, on_all_addresses):
    """``login(address, password)`` from a new browser session at ``address``: the messages shown."""
    now = [1000.0]
    monkeypatch.setattr(auth, "THROTTLE", LoginThrottle(clock=lambda: now[0]))
    monkeypatch.setattr(auth, "FAILURE_BUDGET", FailureBudget(limit=10, window_s=600, clock=lambda: now[0]))
    address = [None]
    monkeypatch.setattr(auth, "_client_address", lambda: address[0])
    password_hash = auth.hash_password(PASSWORD)

    def attempt(client: str, password: str) -> list[str]:
        address[0] = client
        at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
        at.secrets["parallax"] = {"password_hash": password_hash}
        at.run()
        at.text_input[0].input(password)
        at.button[0].click().run()
        return [e.value for e in at.error] or [t.value for t in at.title]

    attempt.clock = now
    return attempt


def test_new_addresses_in_one_ipv6_64_get_no_fresh_tries(login):
    addresses = (f"2001:db8:7:7::{n:x}" for n in itertools.count(1))
    assert login(next(addresses), "guess-1") == ["Wrong password."]
    assert login(next(addresses), "guess-2") == ["Wrong password (2 in a row)."]
    assert login(next(addresses), "guess-3") == ["Wrong password (3 in a row). Wait 1 s before the next try."]
    assert login(next(addresses), PASSWORD) == ["Too many wrong passwords: try again in 1 s."]
    assert login("2001:db8:7:8::1", PASSWORD) == ["Launch a run"]  # the next /64 is another client


def test_many_clients_together_exhaust_the_budget_and_everyone_waits(login, caplog):
    with caplog.at_level(logging.WARNING, logger="parallax.auth"):
        for n in range(10):  # ten clients, one guess each: none is throttled on its own
            assert login(f"10.0.{n}.1", f"guess-{n}") == ["Wrong password."]
        refused = login("192.0.2.77", PASSWORD)  # a new client, with the right password
    assert refused == ["Too many wrong passwords on this dashboard from all clients: try again in 600 s."]
    assert "login refused for client 192.0.2.77: 10 wrong passwords from all clients within 600 s" in caplog.text
    login.clock[0] += 600
    assert login("192.0.2.77", PASSWORD) == ["Launch a run"]

"""The password login's cookie: a browser logs in once and stays logged in for ``[parallax] login_days``.

The cookie holds ``v1.<expires>.<nonce>.<signature>``: an HMAC-SHA256 of the rest under a key made
from the cookie secret and the password hash, so a cookie signed under another secret, or before the
password changed, or past its expiry, or one logged out of, is refused. It is set and cleared by the
server's own routes (ui/serving.py: a page cannot set a cookie over its websocket), ``HttpOnly`` (no
script reads it) and ``SameSite=Strict`` (no other site's page sends it).

How the page hands the login to the route: a right password makes a one-time ticket (``issue_ticket``)
that the page posts back at once (a small script, see ui/auth.py); the route trades it for the cookie.

The cookie secret is ``[parallax] cookie_secret`` in secrets.toml (``python -m ui.auth hash-password``
prints one); without it a random one lives as long as the server, and a restart logs everyone out.
Logging out forgets the cookie's nonce for this server's life; the browser deletes the cookie too.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets as random_tokens
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

COOKIE_NAME = "parallax_login"
VERSION = "v1"
DEFAULT_LOGIN_DAYS = 7.0
MAX_LOGIN_DAYS = 366.0
TICKET_TTL_S = 60.0  # the page posts its ticket right away
MAX_TICKETS = 1000
PROCESS_SECRET = random_tokens.token_hex(32)  # when secrets.toml gives none: valid until the server stops


def login_days(secrets: Mapping[str, Any]) -> float:
    """How long a login lasts: ``[parallax] login_days`` (a number of days, 0 < days <= 366), else 7.
    ValueError naming the value when it is not one."""
    section = secrets.get("parallax") if isinstance(secrets.get("parallax"), Mapping) else {}
    value = section.get("login_days", DEFAULT_LOGIN_DAYS)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_LOGIN_DAYS:
        raise ValueError(f"[parallax] login_days = {value!r} in secrets.toml: it must be a number of days "
                         f"above 0 and at most {MAX_LOGIN_DAYS:g}, e.g. login_days = 7")
    return float(value)


def cookie_secret(secrets: Mapping[str, Any]) -> str:
    section = secrets.get("parallax") if isinstance(secrets.get("parallax"), Mapping) else {}
    configured = section.get("cookie_secret")
    return configured if isinstance(configured, str) and configured.strip() else PROCESS_SECRET


def signing_key(secret: str, password_hash: str) -> bytes:
    """The key cookies are signed with: a new password (or secret) makes every earlier cookie void."""
    return hmac.new(secret.encode(), b"parallax-login\0" + password_hash.encode(), hashlib.sha256).digest()


def _signature(key: bytes, payload: str) -> str:
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()


def make_token(key: bytes, lifetime_s: float, *, now: float | None = None) -> str:
    expires = int((time.time() if now is None else now) + lifetime_s)
    payload = f"{VERSION}.{expires}.{random_tokens.token_hex(16)}"
    return f"{payload}.{_signature(key, payload)}"


@dataclass(frozen=True)
class Login:
    nonce: str
    expires: int


def read_token(token: Any, key: bytes, lifetime_s: float, *, now: float | None = None) -> Login | None:
    """The login a cookie holds, or None when it is malformed, signed under another key, expired, or
    lasts longer than ``lifetime_s`` from now (made before login_days was shortened)."""
    if not isinstance(token, str) or len(token) > 200:
        return None
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != VERSION or not parts[1].isdigit():
        return None
    payload = ".".join(parts[:3])
    if not hmac.compare_digest(_signature(key, payload), parts[3]):
        return None
    now = time.time() if now is None else now
    expires = int(parts[1])
    if not now < expires <= now + lifetime_s + 1:
        return None
    return Login(parts[2], expires)


class LoginBook:
    """Process-wide: tickets waiting to become cookies, and the nonces of cookies logged out of."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._tickets: dict[str, tuple[float, str, float]] = {}  # ticket -> (expires, token, cookie max-age)
        self._revoked: dict[str, int] = {}  # nonce -> the cookie's expiry, after which it is refused anyway

    def issue_ticket(self, token: str, max_age_s: float) -> str:
        now = self._clock()
        ticket = random_tokens.token_urlsafe(24)
        with self._lock:
            self._tickets = {t: v for t, v in self._tickets.items() if v[0] > now}
            if len(self._tickets) >= MAX_TICKETS:  # never redeemed: drop the oldest
                self._tickets.pop(next(iter(self._tickets)))
            self._tickets[ticket] = (now + TICKET_TTL_S, token, max_age_s)
        return ticket

    def pending(self, ticket: Any) -> bool:
        """Whether ``ticket`` still waits to be redeemed (issued, not used, not stale)."""
        with self._lock:
            entry = self._tickets.get(ticket) if isinstance(ticket, str) else None
        return entry is not None and entry[0] > self._clock()

    def redeem(self, ticket: Any) -> tuple[str, float] | None:
        """(cookie value, max-age in s) for a ticket, once; None for an unknown, used or stale one."""
        if not isinstance(ticket, str):
            return None
        with self._lock:
            entry = self._tickets.pop(ticket, None)
        if entry is None or entry[0] <= self._clock():
            return None
        return entry[1], entry[2]

    def revoke(self, login: Login) -> None:
        now = self._clock()
        with self._lock:
            self._revoked = {n: e for n, e in self._revoked.items() if e > now}
            self._revoked[login.nonce] = login.expires

    def revoked(self, login: Login) -> bool:
        with self._lock:
            return login.nonce in self._revoked


BOOK = LoginBook()

"""Who may use the dashboard.

``require_access()`` runs in app.py before any page, in this order:

1. The request's ``Host`` must be a loopback name (localhost, 127.0.0.1, [::1], any port), the
   address the server is bound to, or a host listed in ``[parallax] allowed_hosts`` (or
   ``PARALLAX_ALLOWED_HOSTS``, comma-separated). A page on another site whose name is made to
   resolve to 127.0.0.1 (DNS rebinding) is then refused, though the browser thinks it same-origin.
2. With a login configured, every page is behind it, on every address, loopback included.
3. Without one, only a server bound to loopback serves pages: then everyone who can open a
   connection on this machine can (every local user). A request a reverse proxy forwarded, and
   said so in one of PROXY_HEADERS, is refused; a proxy that adds none cannot be told apart.

Two ways to log in, set in ``.streamlit/secrets.toml``:

- a password, stored hashed (scrypt with a random salt)::

      python -m ui.auth hash-password        # asks twice, prints the lines to paste
      [parallax]
      password_hash = "scrypt$16384$8$1$<salt>$<hash>"
      cookie_secret = "<64 hex digits>"      # signs the login cookie; login_days = 7 by default

  Wrong passwords are throttled per session, per client (an IPv6 client by its /64) and over all
  clients together (``ui.throttle``), and logged (logger ``parallax.auth``, naming the client,
  never the password). A right one also gives the browser a signed, expiring, HttpOnly cookie
  (ui/login_cookie.py), so a reload or a new tab stays logged in for ``login_days`` (default 7);
  Log out ends it.

- Streamlit's own OIDC login (``st.login``), with an ``[auth]`` section as Streamlit documents it
  (``redirect_uri``, ``cookie_secret``, ``client_id``, ``client_secret``, ``server_metadata_url``),
  and who may use it: ``[parallax] allowed_emails = [...]`` and/or ``allowed_domains = [...]``.
  Without an allow-list nobody is let in: the provider knows far more people than should train here.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import hmac
import ipaddress
import logging
import math
import os
import re
import secrets as random_tokens
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ui import login_cookie
from ui.throttle import FailureBudget, LoginThrottle, client_key

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1  # about 50 ms and 16 MB per check: cheap to log in, dear to guess
SALT_BYTES, HASH_BYTES = 16, 32
LOGGED_IN_KEY = "parallax_logged_in"
PASSWORD_KEY, FAILED_KEY = "parallax_login_password", "parallax_login_failed"
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
ALLOWED_HOSTS_ENV = "PARALLAX_ALLOWED_HOSTS"
# Headers a reverse proxy adds: loopback without a login is for this machine's users only.
PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-Ip")
SESSION_TOKEN_KEY = "parallax_login_session"
COOKIE_TICKET_KEY, FORGET_COOKIE_KEY = "parallax_cookie_ticket", "parallax_forget_cookie"
HOST_PATTERN = re.compile(r"^(\[[0-9a-f:.]+\]|[a-z0-9._-]+)(:[0-9]{1,5})?$")
LOG = logging.getLogger("parallax.auth")
# Process-wide: one count per session and one per client address, so a new session does not
# reset a client's count. At most two scrypt checks (16 MiB each) run at once, whoever asks.
THROTTLE = LoginThrottle()
FAILURE_BUDGET = FailureBudget()  # every client together
SCRYPT_SLOTS = threading.BoundedSemaphore(2)
HOW_TO_CONFIGURE = (
    "Either bind to this machine only (`make run`, or `--server.address 127.0.0.1`), or set a password: run "
    "`python -m ui.auth hash-password` and put the line it prints under `[parallax]` in `.streamlit/secrets.toml`; "
    "or configure Streamlit's login (`st.login`) with an `[auth]` section there. Then restart the dashboard."
)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """'scrypt$N$r$p$salt$hash' for ``password``, with a fresh random salt unless one is given."""
    if not password:
        raise ValueError("the password is empty: choose one of at least 8 characters")
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=HASH_BYTES)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def parse_hash(stored: Any) -> tuple[int, int, int, bytes, bytes] | None:
    """(n, r, p, salt, hash) of a stored hash, or None when it is not one ``hash_password`` made."""
    if not isinstance(stored, str):
        return None
    parts = stored.strip().split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        return None
    try:
        n, r, p = (int(x) for x in parts[1:4])
        salt, digest = _unb64(parts[4]), _unb64(parts[5])
    except ValueError:
        return None
    if n < 2 or n & (n - 1) or not 1 <= r <= 64 or not 1 <= p <= 16 or n * r > 2**22 or not salt or not digest:
        return None
    return n, r, p, salt, digest


def verify_password(password: str, stored: Any) -> bool:
    """Whether ``password`` matches ``stored``; False for a malformed hash. Constant-time compare."""
    parsed = parse_hash(stored)
    if parsed is None or not isinstance(password, str):
        return False
    n, r, p, salt, digest = parsed
    candidate = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=len(digest),
                               maxmem=256 * n * r * p + 2**20)
    return hmac.compare_digest(candidate, digest)


def is_loopback(address: str | None) -> bool:
    """Whether a server bound to ``address`` is reachable from this machine only. Unset or empty means
    every interface (Streamlit's default), which is not loopback."""
    if not address:
        return False
    host = address.strip().strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(host_header: Any) -> str | None:
    """The host name of a ``Host`` header ("Example.org:8501" -> "example.org", "[::1]:8501" -> "::1"),
    or None for a malformed one."""
    if not isinstance(host_header, str):
        return None
    match = HOST_PATTERN.match(host_header.strip().lower())
    if match is None:
        return None
    return match.group(1).strip("[]").rstrip(".") or None


def string_list(value: Any) -> list[str]:
    """A setting that lists names: a TOML list of strings, or one comma-separated string."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else []
    return [item.strip().lower() for item in items if isinstance(item, str) and item.strip()]


def allowed_hosts(secrets: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> list[str]:
    """Host names besides loopback ones the dashboard answers to: ``[parallax] allowed_hosts`` and
    ``PARALLAX_ALLOWED_HOSTS``."""
    section = secrets.get("parallax")
    listed = string_list(section.get("allowed_hosts")) if isinstance(section, Mapping) else []
    return [host_name(h) or h for h in listed + string_list(environ.get(ALLOWED_HOSTS_ENV, ""))]


def host_allowed(host_header: Any, allowed: list[str], bind_address: str | None = None) -> bool:
    """Whether a request that names ``host_header`` as its Host is for this dashboard: a loopback
    name, the address the server is bound to, or a host in ``allowed``. Anything else may be a
    name an attacker controls that resolves to this machine."""
    name = host_name(host_header)
    if name is None:
        return False
    bound = host_name(bind_address) if bind_address else None
    return is_loopback(name) or name in allowed or (bound is not None and name == bound and not _every_interface(bound))


def _every_interface(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_unspecified
    except ValueError:
        return False


def forwarded_by_a_proxy(headers: Mapping[str, Any]) -> bool:
    """Whether a request came through a reverse proxy that said so (most add one of PROXY_HEADERS;
    one that adds none cannot be told from a local browser)."""
    return any(headers.get(name) for name in PROXY_HEADERS)


def oidc_refusal(user: Mapping[str, Any], secrets: Mapping[str, Any]) -> str | None:
    """Why (plain text) a user the OIDC provider logged in may not use the dashboard, or None when they may:
    their e-mail (verified, when the provider says) must be in ``[parallax] allowed_emails`` or its
    domain in ``allowed_domains``."""
    section = secrets.get("parallax") if isinstance(secrets.get("parallax"), Mapping) else {}
    emails, domains = string_list(section.get("allowed_emails")), string_list(section.get("allowed_domains"))
    if not emails and not domains:
        return ("No one may use this dashboard yet: the login works, but [parallax] allowed_emails or "
                "allowed_domains in .streamlit/secrets.toml must say who may use it.")
    email = user.get("email")
    if not isinstance(email, str) or email.count("@") != 1:
        return "The login provider sent no e-mail address, so this dashboard cannot tell who you are."
    if user.get("email_verified") is False:
        return f"The login provider has not verified the e-mail address {email}."
    email = email.strip().lower()
    if email in emails or email.rpartition("@")[2] in domains:
        return None
    return f"{email} may not use this dashboard. Ask its owner to add you, then log in again."


def auth_mode(secrets: Mapping[str, Any]) -> str | None:
    """'oidc' when an [auth] section for st.login is configured, 'password' when [parallax]
    password_hash holds a valid hash, else None."""
    section = secrets.get("auth")
    if isinstance(section, Mapping) and section.get("redirect_uri") and section.get("cookie_secret"):
        return "oidc"
    parallax = secrets.get("parallax")
    if isinstance(parallax, Mapping) and parse_hash(parallax.get("password_hash")) is not None:
        return "password"
    return None


def secrets_problem(secrets: Mapping[str, Any]) -> str | None:
    """A password_hash that is there but unusable (so the user knows why the login is not offered)."""
    parallax = secrets.get("parallax")
    if isinstance(parallax, Mapping) and "password_hash" in parallax and parse_hash(parallax["password_hash"]) is None:
        return ("`[parallax] password_hash` in secrets.toml is not a hash made by `python -m ui.auth hash-password` "
                "(expected 'scrypt$N$r$p$salt$hash')")
    return None


# --- Streamlit ---------------------------------------------------------------------------------


def configured_secrets() -> dict[str, Any]:
    import streamlit as st

    try:
        return st.secrets.to_dict()
    except Exception:  # no secrets.toml at all (StreamlitSecretNotFoundError), or one that does not parse
        return {}


def stop_with_page(render) -> None:
    """Show ``render`` as the only page (no navigation to any other, whatever the URL asks) and stop.

    It answers under each dashboard page's path too: a bookmarked page (``/runs``) shows it where it
    was asked, not Streamlit's "Page not found" dialog over it, and is the page that opens once the
    gate is passed."""
    import streamlit as st

    from ui.state import ALL_PAGES

    gate = st.Page(render, title="Parallax", icon=":material/lock:", url_path="parallax", default=True)
    asked = [st.Page(render, title="Parallax", icon=":material/lock:", url_path=Path(page).stem)
             for page in ALL_PAGES]
    st.navigation([gate, *asked], position="hidden").run()
    st.stop()


def require_access() -> None:
    """In app.py, before any page: refuse, ask to log in (then stop), or return and let the page render."""
    import streamlit as st

    secrets = configured_secrets()
    address = st.get_option("server.address")
    headers = st.context.headers
    # No headers at all: no browser connection (AppTest). A browser always sends Host.
    if len(headers) and not host_allowed(headers.get("Host"), allowed_hosts(secrets), address):
        host = headers.get("Host")
        LOG.warning("refused a request for host %r from %s: not a loopback name nor an allowed host",
                    host, _client_address() or "this machine")
        stop_with_page(lambda: _wrong_host(host))
    mode = auth_mode(secrets)
    if mode is None:
        if not is_loopback(address):
            stop_with_page(lambda: _refusal(address, secrets))
        if forwarded_by_a_proxy(headers):
            LOG.warning("refused a request forwarded by a proxy (%s) with no login configured",
                        ", ".join(h for h in PROXY_HEADERS if headers.get(h)))
            stop_with_page(_proxied_refusal)
    elif mode == "oidc":
        if not st.user.get("is_logged_in", False):  # absent until the [auth] section is read
            stop_with_page(_oidc_login)
        refusal = oidc_refusal({"email": st.user.get("email"), "email_verified": st.user.get("email_verified")},
                               secrets)
        if refusal is not None:
            LOG.warning("refused OIDC user %r from %s", st.user.get("email"), _client_address() or "this machine")
            stop_with_page(lambda: _oidc_refused(refusal))
        with st.sidebar:
            st.caption(f"Logged in as {_escape(st.user.get('email') or st.user.get('name') or 'you')}.")
            st.button("Log out", on_click=st.logout, icon=":material/logout:", key="logout")
    else:
        stored_hash = secrets["parallax"]["password_hash"]
        try:
            lifetime_s = login_cookie.login_days(secrets) * 86400
        except ValueError as exc:
            stop_with_page(lambda message=str(exc): st.error(_escape(message), icon=":material/settings:"))
        if not st.session_state.get(LOGGED_IN_KEY) and _cookie_login(secrets, lifetime_s) is None:
            stop_with_page(lambda: _password_login(stored_hash))
        with st.sidebar:
            _hand_cookie_to_browser()
            st.button("Log out", on_click=_log_out, args=(secrets,), icon=":material/logout:", key="logout")


def _escape(text: Any) -> str:
    from ui.text import escape_markdown

    return escape_markdown(text)


def _client_address() -> str | None:
    """The address of the browser's connection; None when it is this machine (Streamlit reports
    loopback as None) or when there is no connection (AppTest). Behind a proxy it is the proxy's."""
    import streamlit as st

    address = st.context.ip_address
    return address if isinstance(address, str) else None  # AppTest's stand-in runtime gives a mock


def _wrong_host(host: Any) -> None:
    import streamlit as st

    st.title("Parallax")
    st.error(f"This dashboard does not answer to the host name {_escape(host)}. It answers only to localhost, "
             "127.0.0.1, [::1] and the hosts its owner allowed; a page on another site may have sent you here.",
             icon=":material/lock:")
    st.markdown("To reach it under another name, add that name to `allowed_hosts` under `[parallax]` in "
                f"`.streamlit/secrets.toml` (or to `{ALLOWED_HOSTS_ENV}`) and restart the dashboard.")


def _proxied_refusal() -> None:
    import streamlit as st

    st.title("Parallax")
    st.error("This request came through a proxy, and no login is configured: without one the dashboard serves "
             "only browsers on this machine.", icon=":material/lock:")
    st.markdown("Set a password: run `python -m ui.auth hash-password` and put the line it prints under "
                "`[parallax]` in `.streamlit/secrets.toml`, or configure Streamlit's login (`st.login`) with an "
                "`[auth]` section there. Then restart the dashboard.")


def _oidc_refused(reason: str) -> None:
    import streamlit as st

    st.title("Parallax")
    st.error(_escape(reason), icon=":material/lock:")  # it holds the e-mail address the provider sent
    st.button("Log out", on_click=st.logout, icon=":material/logout:", key="logout")


def _refusal(address: str | None, secrets: Mapping[str, Any]) -> None:
    import streamlit as st

    st.title("Parallax")
    bound = f"`{address}`" if address else "every network interface"
    st.error(f"This dashboard is listening on {bound}, which other machines can reach, and no login is "
             "configured, so it serves no page.", icon=":material/lock:")
    problem = secrets_problem(secrets)
    if problem:
        st.warning(problem, icon=":material/warning:")
    st.markdown(HOW_TO_CONFIGURE)


def _oidc_login() -> None:
    import streamlit as st

    st.title("Parallax")
    st.info("Log in to use this dashboard.", icon=":material/lock:")
    st.button("Log in", on_click=st.login, type="primary", icon=":material/login:", key="login")


# --- the login cookie (ui/login_cookie.py): a browser logs in once for login_days --------------------


def _cookie_key(secrets: Mapping[str, Any]) -> bytes:
    return login_cookie.signing_key(login_cookie.cookie_secret(secrets), str(secrets["parallax"]["password_hash"]))


def _cookie_login(secrets: Mapping[str, Any], lifetime_s: float) -> login_cookie.Login | None:
    """The login the browser's cookie (as sent when this session connected) holds, if it is good."""
    import streamlit as st

    cookies = st.context.cookies
    found = login_cookie.read_token(cookies.get(login_cookie.COOKIE_NAME) if len(cookies) else None,
                                    _cookie_key(secrets), lifetime_s)
    return None if found is None or login_cookie.BOOK.revoked(found) else found


def revoke_login_cookie(token: Any) -> None:
    """Refuse this cookie from now on (logged out), whatever the browser still sends."""
    secrets = configured_secrets()
    if auth_mode(secrets) != "password":
        return
    found = login_cookie.read_token(token, _cookie_key(secrets), login_cookie.MAX_LOGIN_DAYS * 86400)
    if found is not None:
        login_cookie.BOOK.revoke(found)


def _remember_login(secrets: Mapping[str, Any]) -> None:
    """After a right password: a ticket the page trades for the cookie on its next run."""
    import streamlit as st

    lifetime_s = login_cookie.login_days(secrets) * 86400
    token = login_cookie.make_token(_cookie_key(secrets), lifetime_s)
    st.session_state[COOKIE_TICKET_KEY] = login_cookie.BOOK.issue_ticket(token, lifetime_s)


def _post_from_page(route: str, headers: dict[str, str]) -> None:
    """A script that posts to one of the server's own routes (ui/serving.py), whose response sets or
    clears the cookie: the page's websocket cannot."""
    import json

    import streamlit as st

    from ui.downloads import base_path

    url = f"{base_path()}/_parallax/{route}"
    options = {"method": "POST", "credentials": "same-origin", "headers": {"X-Parallax-Page": "1", **headers}}
    st.html(f"<script>fetch({json.dumps(url)}, {json.dumps(options)});</script>", unsafe_allow_javascript=True)


def _hand_cookie_to_browser() -> None:
    """The script that trades the session's ticket for the cookie, on every run until the browser has
    traded it: a run that goes on to another page at once (a bookmarked page, entered through app.py,
    ui.state.enter_through_app) replaces its elements before the browser can run the script."""
    import streamlit as st

    ticket = st.session_state.get(COOKIE_TICKET_KEY)
    if ticket is None:
        return
    if login_cookie.BOOK.pending(ticket):
        _post_from_page("login", {"X-Parallax-Ticket": ticket})
    else:  # traded (a second post is refused, and changes nothing), or stale
        st.session_state.pop(COOKIE_TICKET_KEY, None)


def _log_out(secrets: Mapping[str, Any] | None = None) -> None:
    import streamlit as st

    from ui.state import APP_RAN_KEY

    st.session_state.pop(LOGGED_IN_KEY, None)
    st.session_state.pop(COOKIE_TICKET_KEY, None)
    # The cookie this session connected with is void at once, in every tab; the login page then posts to
    # the logout route, which voids the cookie the browser holds now (one set after this session
    # connected too) and deletes it.
    if secrets is not None and (found := _cookie_login(secrets, login_cookie.MAX_LOGIN_DAYS * 86400)) is not None:
        login_cookie.BOOK.revoke(found)
    st.session_state[FORGET_COOKIE_KEY] = True
    # A page opened without app.py (see ui.state.enter_through_app) then goes back through the login.
    st.session_state.pop(APP_RAN_KEY, None)


def _password_login(stored_hash: str) -> None:
    import streamlit as st

    if st.session_state.pop(FORGET_COOKIE_KEY, False):
        _post_from_page("logout", {})
    st.title("Parallax")
    with st.form("login"):
        st.text_input("Password", type="password", key=PASSWORD_KEY)
        # A callback runs before the next script run: a right password opens the pages in that very run.
        st.form_submit_button("Log in", type="primary", icon=":material/login:",
                              on_click=_check_password, args=(stored_hash,))
    if st.session_state.get(FAILED_KEY):
        st.error(st.session_state[FAILED_KEY], icon=":material/error:")


def throttle_keys(session_token: str, client: str | None) -> list[str]:
    """The counts a login try is charged to: its session's, and its client's if known (an IPv6
    client by its /64 prefix, ``client_key``)."""
    return [f"session:{session_token}"] + ([f"client:{client_key(client)}"] if client else [])


def _check_password(stored_hash: str) -> None:
    import streamlit as st

    password = st.session_state.pop(PASSWORD_KEY, "")  # the typed password is not kept in the session
    token = st.session_state.setdefault(SESSION_TOKEN_KEY, random_tokens.token_hex(8))
    # Loopback connections (ip_address None, but headers present) share one count.
    client = _client_address() or ("127.0.0.1" if len(st.context.headers) else None)
    keys = throttle_keys(token, client)
    wait_s = max(THROTTLE.wait_s(key) for key in keys)
    budget_wait_s = FAILURE_BUDGET.wait_s()
    if budget_wait_s > wait_s:  # guesses from many clients: everyone waits
        LOG.warning("login refused for client %s: %d wrong passwords from all clients within %d s, next try in %d s",
                    client or "unknown", FAILURE_BUDGET.limit, FAILURE_BUDGET.window_s, math.ceil(budget_wait_s))
        st.session_state[LOGGED_IN_KEY] = False
        st.session_state[FAILED_KEY] = (f"Too many wrong passwords on this dashboard from all clients: try again in "
                                        f"{math.ceil(budget_wait_s)} s.")
        return
    if wait_s > 0:  # refused before scrypt runs: a guess costs nothing until the wait is over
        LOG.warning("login refused for client %s: %d wrong passwords in a row, next try in %d s",
                    client or "unknown", max(THROTTLE.failures(key) for key in keys), math.ceil(wait_s))
        st.session_state[LOGGED_IN_KEY] = False
        st.session_state[FAILED_KEY] = f"Too many wrong passwords: try again in {math.ceil(wait_s)} s."
        return
    with SCRYPT_SLOTS:
        ok = verify_password(password, stored_hash)
    st.session_state[LOGGED_IN_KEY] = ok
    if ok:
        for key in keys:
            THROTTLE.succeeded(key)
        st.session_state.pop(FAILED_KEY, None)
        _remember_login(configured_secrets())
        return
    FAILURE_BUDGET.failed()
    wait_s = max(THROTTLE.failed(key) for key in keys)
    failures = max(THROTTLE.failures(key) for key in keys)
    LOG.warning("wrong password from client %s (%d in a row)", client or "unknown", failures)
    in_a_row = f" ({failures} in a row)" if failures > 1 else ""
    wait = f" Wait {math.ceil(wait_s)} s before the next try." if wait_s > 0 else ""
    st.session_state[FAILED_KEY] = f"Wrong password{in_a_row}.{wait}"


def main(argv: list[str] | None = None) -> int:
    """``python -m ui.auth hash-password``: prints the secrets.toml lines for a password (and a cookie secret)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["hash-password"]:
        print("usage: python -m ui.auth hash-password", file=sys.stderr)
        return 2
    if sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            print("error: the two passwords differ", file=sys.stderr)
            return 1
    else:
        password = sys.stdin.readline().rstrip("\n")
    if len(password) < 8:
        print("error: the password is shorter than 8 characters: choose a longer one", file=sys.stderr)
        return 1
    # The key the login cookie is signed with: logins then outlast a restart of the dashboard.
    print(f'[parallax]\npassword_hash = "{hash_password(password)}"\ncookie_secret = "{random_tokens.token_hex(32)}"')
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Who may use the dashboard: anyone on this machine when it listens on loopback only, and only
someone who logs in when it listens on an address other machines can reach.

Two ways to log in, set in ``.streamlit/secrets.toml``:

- a password, stored hashed (scrypt with a random salt)::

      python -m ui.auth hash-password        # asks twice, prints the line to paste
      [parallax]
      password_hash = "scrypt$16384$8$1$<salt>$<hash>"

- Streamlit's own OIDC login (``st.login``), with an ``[auth]`` section as Streamlit documents it
  (``redirect_uri``, ``cookie_secret``, ``client_id``, ``client_secret``, ``server_metadata_url``).

``require_access()`` runs in app.py before any page: on a non-loopback address without either, the
dashboard refuses to serve and says how to configure one; with one, every page is behind the login.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import hmac
import ipaddress
import os
import sys
from collections.abc import Mapping
from typing import Any

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1  # about 50 ms and 16 MB per check: cheap to log in, dear to guess
SALT_BYTES, HASH_BYTES = 16, 32
LOGGED_IN_KEY = "parallax_logged_in"
PASSWORD_KEY, FAILED_KEY = "parallax_login_password", "parallax_login_failed"
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
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


def _secrets() -> dict[str, Any]:
    import streamlit as st

    try:
        return st.secrets.to_dict()
    except Exception:  # no secrets.toml at all (StreamlitSecretNotFoundError), or one that does not parse
        return {}


def stop_with_page(render) -> None:
    """Show ``render`` as the only page (no navigation to any other, whatever the URL asks) and stop."""
    import streamlit as st

    page = st.Page(render, title="Parallax", icon=":material/lock:", url_path="parallax", default=True)
    st.navigation([page], position="hidden").run()
    st.stop()


def require_access() -> None:
    """In app.py, before any page: refuse, ask to log in (then stop), or return and let the page render."""
    import streamlit as st

    secrets = _secrets()
    mode = auth_mode(secrets)
    address = st.get_option("server.address")
    if mode is None:
        if not is_loopback(address):
            stop_with_page(lambda: _refusal(address, secrets))
    elif mode == "oidc":
        if not st.user.get("is_logged_in", False):  # absent until the [auth] section is read
            stop_with_page(_oidc_login)
        with st.sidebar:
            st.caption(f"Logged in as {st.user.get('email') or st.user.get('name') or 'you'}.")
            st.button("Log out", on_click=st.logout, icon=":material/logout:", key="logout")
    else:
        if not st.session_state.get(LOGGED_IN_KEY):
            stop_with_page(lambda: _password_login(secrets["parallax"]["password_hash"]))
        with st.sidebar:
            st.button("Log out", on_click=_log_out, icon=":material/logout:", key="logout")


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


def _log_out() -> None:
    import streamlit as st

    from ui.state import APP_RAN_KEY

    st.session_state.pop(LOGGED_IN_KEY, None)
    # A page opened without app.py (see ui.state.enter_through_app) then goes back through the login.
    st.session_state.pop(APP_RAN_KEY, None)


def _password_login(stored_hash: str) -> None:
    import streamlit as st

    st.title("Parallax")
    with st.form("login"):
        st.text_input("Password", type="password", key=PASSWORD_KEY)
        # A callback runs before the next script run: a right password opens the pages in that very run.
        st.form_submit_button("Log in", type="primary", icon=":material/login:",
                              on_click=_check_password, args=(stored_hash,))
    if st.session_state.get(FAILED_KEY):
        st.error("Wrong password.", icon=":material/error:")


def _check_password(stored_hash: str) -> None:
    import streamlit as st

    password = st.session_state.pop(PASSWORD_KEY, "")  # the typed password is not kept in the session
    ok = verify_password(password, stored_hash)
    st.session_state[LOGGED_IN_KEY] = ok
    st.session_state[FAILED_KEY] = not ok


def main(argv: list[str] | None = None) -> int:
    """``python -m ui.auth hash-password``: prints the secrets.toml lines for a password."""
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
    print(f'[parallax]\npassword_hash = "{hash_password(password)}"')
    return 0


if __name__ == "__main__":
    sys.exit(main())

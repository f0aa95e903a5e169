"""Links to a run's files that the server streams from disk (route in ui/serving.py).

A page that passed the access checks (ui/auth.py) makes the link; the link carries the run id, the
file's name and an expiry, signed with a secret that lives as long as the server. The route checks
the signature and the expiry, finds the file again through the run's folder (``db.access.run_file``:
a run that is gone, or a name that leads out of its folder, gets no file) and sends it in 64 KiB
chunks: a multi-GB checkpoint costs the server no more memory than a small one.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets as random_tokens
import time
from pathlib import Path
from urllib.parse import quote

ROUTE = "/_parallax/download"
LINK_TTL_S = 3600.0
LINK_SECRET = random_tokens.token_bytes(32)
FILE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


def base_path() -> str:
    """Streamlit's ``server.baseUrlPath`` as a path prefix of the server's routes: "" or "/dash"."""
    from streamlit import config

    prefix = (config.get_option("server.baseUrlPath") or "").strip("/")
    return f"/{prefix}" if prefix else ""


def _signature(run_id: int, name: str, expires: int) -> str:
    return hmac.new(LINK_SECRET, f"{run_id}/{name}/{expires}".encode(), hashlib.sha256).hexdigest()


def link(run_id: int, name: str, *, prefix: str | None = None, now: float | None = None) -> str:
    """The URL path that downloads ``name`` of run ``run_id`` for the next LINK_TTL_S seconds (under
    ``prefix``, by default the server's base path)."""
    if not FILE_NAME.match(name):
        raise ValueError(f"file name {name!r}: only letters, digits, '.', '_' and '-' may be linked")
    expires = int((time.time() if now is None else now) + LINK_TTL_S)
    prefix = base_path() if prefix is None else prefix
    return (f"{prefix.rstrip('/')}{ROUTE}/{int(run_id)}/{quote(name)}"
            f"?expires={expires}&sig={_signature(int(run_id), name, expires)}")


def link_problem(run_id: int, name: str, expires: str | None, sig: str | None, *,
                 now: float | None = None) -> str | None:
    """Why a download link is refused (plain text), or None when it is good."""
    if not FILE_NAME.match(name) or not expires or not expires.isdigit() or not sig or len(sig) != 64:
        return "This download link is malformed."
    if not hmac.compare_digest(_signature(run_id, name, int(expires)), sig):
        return "This download link was not made by this dashboard (or it has restarted since): open the run again."
    if int(expires) <= (time.time() if now is None else now):
        return "This download link has expired: open the run's page again for a new one."
    return None


def attachment_name(run_id: int, name: str) -> str:
    return f"parallax-run-{run_id}-{Path(name).name}"

"""The dashboard's HTTP side, around Streamlit's own server.

``streamlit run app.py`` finds ``app`` (a ``streamlit.starlette.App``) in app.py and serves it with
uvicorn: Streamlit's routes and websocket, plus what is here:

- ``NoFraming``: every response says no other page may frame it (``X-Frame-Options: DENY`` and
  ``Content-Security-Policy: frame-ancestors 'none'``). Framed by a page on another site, the
  dashboard would take clicks meant for that page (Launch, Cancel, Delete) with the user's login,
  and the Host and websocket-origin checks would pass: the frame's requests are the dashboard's own.
- ``/_parallax/login`` and ``/_parallax/logout``: set and clear the login cookie (ui/login_cookie.py).
- ``/_parallax/download/<run>/<file>?expires=...&sig=...``: a run's file, for a link a page signed,
  streamed from disk in 64 KiB chunks (ui/downloads.py).
- ``/_parallax/live/<run>?expires=...&sig=...&after=STEP``: a running run's status and new step points, for
  the Run page's live charts (ui/live_feed.py); ``/_parallax/script-live/<run>?...&name=N&after=STEP``, a script
  run's logged metrics after the steps its live charts hold (ui/script_feed.py); and ``/_parallax/plotly.min.js``, which draws them.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ui import auth, downloads, live_feed, login_cookie, script_feed

CHUNK_BYTES = 64 * 1024  # a download is read and sent this much at a time, never held whole
FRAME_HEADERS = ((b"x-frame-options", b"DENY"), (b"content-security-policy", b"frame-ancestors 'none'"))


class NoFraming:
    """ASGI middleware: the frame headers on every HTTP response, whatever route made it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-frame-options"]
                # A CSP a route set stays: a browser enforces every CSP header it gets.
                message = {**message, "headers": headers + list(FRAME_HEADERS)}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class DownloadsUncompressed:
    """ASGI middleware: a download's request reaches Streamlit's gzip middleware without ``Accept-Encoding``,
    so a checkpoint (hardly compressible) is sent as it is on disk, not gzipped on the fly at a core's cost."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith(f"{downloads.base_path()}{downloads.ROUTE}/"):
            headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"accept-encoding"]
            scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)


WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")


def own_url() -> str:
    """The dashboard's address as it was started (scheme, address, port, base path), which links in messages
    use: ``parallax ui --port 8600`` links to port 8600. An address on every interface is named by this
    machine's host name, which other machines resolve where a wildcard address means nothing."""
    import socket

    from streamlit import config

    address = (config.get_option("server.address") or "").strip()
    host = socket.getfqdn() if address in WILDCARD_ADDRESSES else address
    host = f"[{host}]" if ":" in host else host
    scheme = "https" if config.get_option("server.sslCertFile") else "http"
    return f"{scheme}://{host}:{config.get_option('server.port')}{downloads.base_path()}"


def record_own_url() -> None:
    """Tell the runs of this home where the dashboard is (``db.notify``'s links), as the server starts; a home
    that cannot be written is said in the server's log, and links keep the address they had."""
    import sys

    from db import notify

    try:
        notify.record_dashboard_url(own_url())
    except (OSError, ValueError) as exc:
        print(f"parallax: links in messages keep {notify.dashboard_url()[0]}: this dashboard's address could not be "
              f"recorded ({exc})", file=sys.stderr)


def middleware() -> list:
    from starlette.middleware import Middleware

    return [Middleware(NoFraming), Middleware(DownloadsUncompressed)]


def routes() -> list:
    from starlette.routing import Route

    return [Route(f"{downloads.base_path()}/_parallax/login", log_in, methods=["POST"]),
            Route(f"{downloads.base_path()}/_parallax/logout", log_out, methods=["POST"]),
            Route(f"{downloads.base_path()}{downloads.ROUTE}/{{run_id:int}}/{{name}}", download, methods=["GET"]),
            Route(f"{downloads.base_path()}{live_feed.ROUTE}/{{run_id:int}}", live_points, methods=["GET"]),
            Route(f"{downloads.base_path()}{script_feed.ROUTE}/{{run_id:int}}", script_points, methods=["GET"]),
            Route(f"{downloads.base_path()}{live_feed.PLOTLY_ROUTE}", plotly_js, methods=["GET"])]


# A header a page on another site cannot send without the browser asking first (CORS), and the dashboard
# answers no such question: only the dashboard's own pages can post to these routes.
OWN_PAGE_HEADER = "X-Parallax-Page"


def _host_refusal(request) -> Any:
    """A 403 for a request that names a host the dashboard does not answer to (DNS rebinding), else None."""
    from starlette.responses import PlainTextResponse
    from streamlit import config

    if auth.host_allowed(request.headers.get("host"), auth.allowed_hosts(auth.configured_secrets()),
                         config.get_option("server.address")):
        return None
    return PlainTextResponse("This dashboard does not answer to that host name.", status_code=403)


def _cookie_settings() -> dict[str, Any]:
    from streamlit import config

    return {"path": downloads.base_path() or "/", "httponly": True, "samesite": "strict",
            "secure": bool(config.get_option("server.sslCertFile"))}


def log_in(request) -> Any:
    """Trade a one-time ticket (from a right password, ui/auth.py) for the login cookie."""
    from starlette.responses import PlainTextResponse, Response

    if (refused := _host_refusal(request)) is not None:
        return refused
    if request.headers.get(OWN_PAGE_HEADER) != "1":
        return PlainTextResponse("Only the dashboard's own page may log in here.", status_code=403)
    redeemed = login_cookie.BOOK.redeem(request.headers.get("X-Parallax-Ticket"))
    if redeemed is None:
        return PlainTextResponse("Unknown or used login ticket: log in again.", status_code=403)
    token, max_age_s = redeemed
    response = Response(status_code=204, headers={"Cache-Control": "no-store"})
    response.set_cookie(login_cookie.COOKIE_NAME, token, max_age=int(max_age_s), **_cookie_settings())
    return response


def log_out(request) -> Any:
    """Forget the login cookie, in this browser and (its nonce) on this server."""
    from starlette.responses import PlainTextResponse, Response

    if request.headers.get(OWN_PAGE_HEADER) != "1":
        return PlainTextResponse("Only the dashboard's own page may log out here.", status_code=403)
    auth.revoke_login_cookie(request.cookies.get(login_cookie.COOKIE_NAME))
    response = Response(status_code=204, headers={"Cache-Control": "no-store"})
    response.delete_cookie(login_cookie.COOKIE_NAME, **_cookie_settings())
    return response


def download(request) -> Any:
    """A run's file, streamed from disk, for a link a page made (ui/downloads.py)."""
    from starlette.responses import PlainTextResponse, StreamingResponse

    from db.folders import NotARegularFile, open_regular_file
    from contract.environment import database_url
    from trainer_backend.control.housekeeping import OutsideRunFolder, run_file
    from ui.state import engine_for

    if (refused := _host_refusal(request)) is not None:
        return refused
    run_id, name = request.path_params["run_id"], request.path_params["name"]
    problem = downloads.link_problem(run_id, name, request.query_params.get("expires"),
                                     request.query_params.get("sig"))
    if problem is not None:
        return PlainTextResponse(problem, status_code=403)
    try:
        path = run_file(engine_for(database_url()), run_id, name)
    except (OutsideRunFolder, ValueError) as exc:
        return PlainTextResponse(str(exc), status_code=403)
    try:
        # Opened without blocking and checked on the descriptor: a named pipe put in its place would hang the
        # reader, and a check before opening would leave a moment to swap the file (db/folders.py).
        handle = open_regular_file(path)
    except (OSError, NotARegularFile):  # gone since, or not a regular file
        return PlainTextResponse(f"Run #{run_id} has no file {name} (any more).", status_code=404)

    def chunks():
        with handle:
            while block := handle.read(CHUNK_BYTES):
                yield block

    filename = re.sub(r"[^\w.-]", "_", downloads.attachment_name(run_id, name))  # nothing that ends the header value
    return StreamingResponse(chunks(), media_type="application/octet-stream", headers={
        "Content-Length": str(os.fstat(handle.fileno()).st_size), "Cache-Control": "no-store",
        "Content-Disposition": f'attachment; filename="{filename}"'})


def live_points(request) -> Any:
    """A run's status, progress and the step points after ``after``, for a link a Run page signed (ui/live_feed.py)."""
    from starlette.responses import JSONResponse, PlainTextResponse

    from contract.environment import database_url
    from ui.state import engine_for

    if (refused := _host_refusal(request)) is not None:
        return refused
    run_id = request.path_params["run_id"]
    problem = live_feed.link_problem(run_id, request.query_params.get("expires"), request.query_params.get("sig"))
    if problem is not None:
        return PlainTextResponse(problem, status_code=403)
    after = live_feed.parse_after(request.query_params.get("after", "0"))
    if after is None:
        return PlainTextResponse("after must be a step number from 0 up.", status_code=400)
    payload = live_feed.feed(engine_for(database_url()), run_id, after)
    if payload is None:
        return PlainTextResponse(f"Run #{run_id} does not exist (any more).", status_code=404)
    return JSONResponse(payload, headers={"Cache-Control": "no-store"})


def script_points(request) -> Any:
    """A script run's status and its named metrics' values after the steps asked, for a link a Run page signed
    (ui/script_feed.py)."""
    from starlette.responses import JSONResponse, PlainTextResponse

    from contract.environment import database_url
    from ui.state import engine_for

    if (refused := _host_refusal(request)) is not None:
        return refused
    run_id = request.path_params["run_id"]
    problem = live_feed.link_problem(run_id, request.query_params.get("expires"), request.query_params.get("sig"))
    if problem is not None:
        return PlainTextResponse(problem, status_code=403)
    asked = script_feed.parse_request(request.query_params.getlist("name"), request.query_params.getlist("after"))
    if isinstance(asked, str):
        return PlainTextResponse(asked, status_code=400)
    payload = script_feed.feed(engine_for(database_url()), run_id, *asked)
    if payload is None:
        return PlainTextResponse(f"Run #{run_id} does not exist (any more).", status_code=404)
    return JSONResponse(payload, headers={"Cache-Control": "no-store"})


def plotly_js(request) -> Any:
    """plotly.js for the live charts; the browser keeps it for a day."""
    from starlette.responses import Response

    if (refused := _host_refusal(request)) is not None:
        return refused
    return Response(live_feed.plotly_js(), media_type="text/javascript", headers={"Cache-Control": "private, max-age=86400"})

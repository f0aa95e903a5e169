"""One POST of a JSON message to a webhook, bounded by a wall-clock deadline, redirects refused.

    answer = post_json("https://hooks.slack.com/services/T0/B0/XXXX", b'{"text": "..."}', deadline_s=5.0)
    answer.status          # 200; or 0 with answer.problem: one line that never holds the URL's path

urllib's ``timeout`` bounds each socket operation, not the exchange: a receiver that answers a byte
at a time, each within the timeout, could hold a delivery (and the process that waits for it at exit)
for as long as it liked. Here every read and write waits at most what is left of the deadline, so the
whole exchange (connecting, sending, the answer's status line and headers) ends by it; the answer's
body is never read.

A redirect is not followed: urllib would turn a redirected POST into a GET without its body, so the
receiver would get nothing while the delivery looked taken; and a redirect to another host would hand
it the message. The answer says where it redirects, by scheme, host and port.

The URL carries its secret (Slack's and Discord's do, in their path), so nothing here prints, raises or
returns more of it than its scheme, host and port (``shown_url``): exceptions of the HTTP library, whose
messages may quote the URL, are named by their type.
"""

from __future__ import annotations

import functools
import http.client
import io
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

# Characters an HTTP request line cannot carry as they are: http.client refuses the first kind and cannot
# encode the second (a URL's path must be percent-encoded).
_SPACE_OR_CONTROL = {chr(code) for code in (*range(0x21), 0x7F)}


def shown_url(url: str) -> str:
    """What may be said of a webhook: its scheme, host and port, never the path or query that hold its secret."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return "(not a URL)"
    if not host:
        return "(not a URL)"
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:  # a port that is not a number: the host alone
        port = ""
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{port}/…"


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a webhook (said by scheme, host and port only), or None."""
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port  # .port raises on a port that is not a number in range
    except ValueError:
        return "is not a URL Parallax can post to (its host or port cannot be read)"
    if parts.scheme not in ("http", "https") or not host:
        return "is not allowed: give an http:// or https:// URL with a host"
    if any(character in _SPACE_OR_CONTROL for character in url):
        return "has a space or a control character: percent-encode it (%20 for a space)"
    if not url.isascii():
        return "has a character that is not ASCII: percent-encode it, as the receiver's own URL is"
    return None


@dataclass(frozen=True)
class Answer:
    """How a POST ended: ``status`` (an HTTP status, or 0 where none came back) and ``problem`` (one line,
    empty for a 2xx); ``retry``: whether trying again could change it."""

    status: int
    problem: str = ""
    retry: bool = True

    @property
    def taken(self) -> bool:
        return 200 <= self.status < 300


def post_json(url: str, body: bytes, *, deadline_s: float) -> Answer:
    """POST ``body`` to ``url`` as JSON; the exchange ends within ``deadline_s`` whatever the receiver does
    (but for resolving the host name, which the system does and nothing interrupts). Never raises."""
    deadline = time.monotonic() + deadline_s
    opener = urllib.request.build_opener(_RefuseRedirects(), _HTTPHandler(deadline), _HTTPSHandler(deadline))
    try:
        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Content-Type": "application/json", "User-Agent": "parallax"})
        with opener.open(request, timeout=deadline_s) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            location = exc.headers.get("Location", "") if exc.headers is not None else ""
            where = shown_url(urljoin(url, location)) if location else "nowhere it said"
            return Answer(exc.code, f"HTTP {exc.code}, a redirect to {where}: not followed (it would post the "
                                    "message again without its body); give the webhook's final URL", retry=False)
        # The receiver refuses this message: sending it again changes nothing (but for "too many requests").
        return Answer(exc.code, f"HTTP {exc.code}", retry=not (400 <= exc.code < 500 and exc.code != 429))
    except urllib.error.URLError as exc:
        return Answer(0, _described(exc.reason, deadline_s))
    except Exception as exc:  # noqa: BLE001 - whatever the HTTP library raises, one line without the URL
        return Answer(0, _described(exc, deadline_s), retry=not isinstance(exc, (ValueError, http.client.InvalidURL)))
    return Answer(status, "" if 200 <= status < 300 else f"HTTP {status}")


def _described(reason: object, deadline_s: float) -> str:
    """One line for why a POST failed, without any part of the URL: the HTTP library's own messages quote
    it (InvalidURL names the path), so only the socket's own errors are said in words."""
    if isinstance(reason, TimeoutError):
        return f"no whole answer within {deadline_s:g} s"
    if isinstance(reason, (ValueError, http.client.InvalidURL)):
        return f"the HTTP client refused the URL ({type(reason).__name__})"
    if isinstance(reason, http.client.HTTPException):  # closed without an answer, not HTTP ...
        return f"no usable answer ({type(reason).__name__})"
    if isinstance(reason, OSError) and reason.strerror:  # refused, unreachable, no such host ...
        return f"{type(reason).__name__}: {reason.strerror}"
    return type(reason).__name__


# --- urllib with a deadline and without redirects ---------------------------------------------


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # the 3xx reaches the caller as an HTTPError


def _left(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("the webhook's deadline passed")
    return remaining


class _ReadsByDeadline(io.RawIOBase):
    """A socket's reader (its ``makefile``) whose every read waits at most what is left of the deadline."""

    def __init__(self, sock: socket.socket, deadline: float):
        self._sock, self._raw, self._deadline = sock, sock.makefile("rb", buffering=0), deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self._sock.settimeout(_left(self._deadline))
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _SocketByDeadline:
    """What http.client's response reads the answer from: the connection's socket, each read bounded."""

    def __init__(self, sock: socket.socket, deadline: float):
        self._sock, self._deadline = sock, deadline

    def makefile(self, mode: str = "rb", *args, **kwargs):
        return io.BufferedReader(_ReadsByDeadline(self._sock, self._deadline))


class _AnswerByDeadline(http.client.HTTPResponse):
    def __init__(self, sock, *args, deadline: float, **kwargs):
        super().__init__(_SocketByDeadline(sock, deadline), *args, **kwargs)


def _bounded(connection_class: type, deadline: float) -> type:
    """``connection_class`` whose connect, send and every read of the answer end by ``deadline``."""

    class Bounded(connection_class):
        response_class = functools.partial(_AnswerByDeadline, deadline=deadline)

        def connect(self):
            self.timeout = _left(deadline)
            super().connect()
            self.sock.settimeout(_left(deadline))  # sending the request: sendall's whole time

    return Bounded


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: float):
        super().__init__()
        self._deadline = deadline

    def do_open(self, http_class, req, **kwargs):
        return super().do_open(_bounded(http_class, self._deadline), req, **kwargs)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: float):
        super().__init__()
        self._deadline = deadline

    def do_open(self, http_class, req, **kwargs):
        return super().do_open(_bounded(http_class, self._deadline), req, **kwargs)

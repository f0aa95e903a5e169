"""Webhooks: a real HTTP receiver on 127.0.0.1 takes what a run's end posts (db/notify.py), as generic JSON
with Slack's ``text`` and Discord's ``content``; delivery retries a bounded number of times; the URL, which
holds the secret, stays out of the database and the logs.

    .venv/bin/python -m pytest tests/db/test_notify.py -q
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from db import run_state, notify, store

SECRET = "T0SECRET/B0SECRET/xyzSECRETxyz"


class Receiver:
    """An HTTP server on 127.0.0.1 that keeps every POST and answers ``statuses`` in turn (then 200)."""

    def __init__(self, statuses=()):
        self.posts: list[dict] = []
        self.statuses = list(statuses)
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.arrived:
                    receiver.posts.append({"path": self.path, "body": json.loads(body),
                                           "type": self.headers["Content-Type"]})
                    receiver.arrived.notify_all()
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/{SECRET}"

    def wait_for(self, count: int, timeout_s: float = 30) -> list[dict]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.posts) >= count, timeout=timeout_s), self.posts
        return self.posts

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


def ended_run(engine, receiver, monkeypatch, status: str, error: str | None = None) -> tuple[int, list]:
    monkeypatch.setenv(notify.WEBHOOKS_ENV, receiver.url)
    run_id = store.create_run(engine, {"dataset": "digits", "model": "resnet18", "strategy": "ddp",
                                       "devices": ["cpu", "cpu"], "tags": ["nightly"]}, status="running")
    store.log_epoch(engine, run_id, {"epoch": 1, "train_loss": 1.0, "val_loss": 1.0, "train_acc": 0.5, "val_acc": 0.625,
                                     "epoch_time_s": 1.0, "train_time_s": 1.0, "images_per_s": 10.0,
                                     "peak_memory_mb": {}})
    assert run_state.finish(engine, run_id, status, error=error)
    return run_id, receiver.wait_for(1)


def test_a_finished_run_posts_generic_slack_and_discord_fields(engine, parallax_home, receiver, monkeypatch):
    run_id, [post] = ended_run(engine, receiver, monkeypatch, "completed")
    body = post["body"]
    assert post["type"] == "application/json" and post["path"] == f"/hooks/{SECRET}"
    assert body["event"] == "run.completed"
    assert body["run"]["id"] == run_id and body["run"]["status"] == "completed"
    assert body["run"]["best_val_acc"] == 0.625 and body["run"]["tags"] == ["nightly"]
    assert body["run"]["link"] == f"http://127.0.0.1:8501/run?run={run_id}"
    assert body["text"] == body["content"]
    assert body["text"].startswith(f"Parallax run #{run_id} (ddp, resnet18 on digits) completed (best validation "
                                   "accuracy 62.5%)")


def test_a_failed_run_posts_its_reason_once(engine, parallax_home, receiver, monkeypatch):
    reason = "loss became NaN at epoch 2 step 7 (lr 0.01); the run stopped there"
    run_id, [post] = ended_run(engine, receiver, monkeypatch, "failed", reason)
    assert post["body"]["event"] == "run.failed" and post["body"]["run"]["reason"] == reason
    assert f"failed: {reason}" in post["body"]["text"]
    assert not run_state.finish(engine, run_id, "lost", error="later")  # the first end stands, and is told once
    assert len(receiver.posts) == 1


def test_a_cancelled_run_is_told(engine, parallax_home, receiver, monkeypatch):
    run_id, [post] = ended_run(engine, receiver, monkeypatch, "cancelled", "cancelled by the user")
    assert post["body"]["event"] == "run.cancelled" and post["body"]["run"]["reason"] == "cancelled by the user"


def test_a_run_marked_lost_is_told(engine, parallax_home, receiver, monkeypatch):
    monkeypatch.setenv(notify.WEBHOOKS_ENV, receiver.url)
    run_id = store.create_run(engine, {"dataset": "digits", "model": "resnet18", "strategy": "single"}, status="running")
    store.set_process(engine, run_id, pid=2**22 + 1, host=__import__("socket").gethostname())  # no such process
    assert run_state.mark_lost_runs(engine) == [run_id]
    [post] = receiver.wait_for(1)
    assert post["body"]["event"] == "run.lost" and "is gone" in post["body"]["run"]["reason"]


def test_the_webhook_url_stays_out_of_the_database(engine, parallax_home, receiver, monkeypatch, db_url):
    ended_run(engine, receiver, monkeypatch, "completed")
    database = db_url.removeprefix("sqlite:///")
    assert b"SECRET" not in open(database, "rb").read()


def test_a_runs_messages_reach_a_webhook_in_the_order_sent_even_when_the_first_is_retried(
        engine, parallax_home, receiver, monkeypatch):
    # A run that trained on through a NaN loss and then ended: "diverged" first, though its first try fails and
    # its second waits a second (BACKOFF_S), long after "completed" was sent.
    monkeypatch.setenv(notify.WEBHOOKS_ENV, receiver.url)
    receiver.statuses = [500]
    run_id = store.create_run(engine, {"dataset": "digits", "model": "resnet18", "strategy": "single"}, status="running")
    threads = notify.notify(engine, run_id, "run.diverged", "the training loss was NaN")
    threads += notify.notify(engine, run_id, "run.completed", "")
    for thread in threads:
        thread.join(timeout=30)
    assert [p["body"]["event"] for p in receiver.posts] == ["run.diverged", "run.diverged", "run.completed"]


def test_delivery_retries_a_receiver_that_fails_then_takes_it(receiver):
    receiver.statuses = [500, 503]
    assert notify.deliver(receiver.url, {"event": "run.completed"}, backoff_s=0.01)
    assert len(receiver.posts) == 3


def test_delivery_gives_up_after_its_attempts_naming_the_host_not_the_secret(receiver, capsys):
    receiver.statuses = [500] * 5
    assert not notify.deliver(receiver.url, {"event": "run.failed", "run": {"id": 7}}, attempts=3, backoff_s=0.01)
    assert len(receiver.posts) == 3
    said = capsys.readouterr().err
    port = receiver.server.server_address[1]
    assert f"webhook http://127.0.0.1:{port}/… did not take the run.failed message of run 7 after 3 tries: HTTP 500" in said
    assert "SECRET" not in said


def test_a_refused_message_is_not_sent_again(receiver):
    receiver.statuses = [400]
    assert not notify.deliver(receiver.url, {"event": "run.completed"}, backoff_s=0.01)
    assert len(receiver.posts) == 1


def test_nobody_listening_ends_within_its_bound(capsys):
    assert not notify.deliver("http://127.0.0.1:9/x", {"event": "run.lost", "run": {"id": 1}}, attempts=2,
                              timeout_s=1, backoff_s=0.01)
    assert "after 2 tries" in capsys.readouterr().err


def test_webhooks_come_from_the_variable_and_the_homes_file(parallax_home, monkeypatch):
    monkeypatch.setenv(notify.WEBHOOKS_ENV, "https://a.example/1, https://b.example/2,")
    (parallax_home / notify.WEBHOOKS_FILE).write_text("# the team's channel\nhttps://b.example/2\nhttps://c.example/3\n")
    assert notify.webhook_urls() == ["https://a.example/1", "https://b.example/2", "https://c.example/3"]


@pytest.mark.parametrize("url", ["ftp://a.example/x", "hooks.slack.com/services/x", "http:///nohost"])
def test_a_webhook_that_is_not_an_http_url_is_refused_in_one_line(url):
    with pytest.raises(ValueError, match="is not allowed: give an http:// or https:// URL with a host"):
        notify.check_webhook_url(url)


# --- receivers that redirect, trickle, or are named by URLs the HTTP library refuses --------------


class Redirecting(Receiver):
    """A receiver whose webhook path answers ``code`` with a Location on itself (holding the secret too); it keeps
    every request, by method, that reaches the place it redirects to."""

    def __init__(self, code: int):
        super().__init__()
        self.redirected: list[str] = []
        receiver = self
        base = self.server.RequestHandlerClass

        class Handler(base):
            def do_POST(self):
                if self.path.startswith("/moved/"):
                    receiver.redirected.append("POST")
                    return super().do_POST()
                self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.arrived:
                    receiver.posts.append({"path": self.path})
                    receiver.arrived.notify_all()
                self.send_response(code)
                self.send_header("Location", f"/moved/{SECRET}")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):
                receiver.redirected.append("GET")
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server.RequestHandlerClass = Handler


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_is_not_followed_and_is_said_in_one_line(code, capsys):
    # urllib followed 301-303 as a GET without the message (the receiver got nothing, the delivery looked
    # taken), and tried 307/308 three times as a failure.
    receiver = Redirecting(code)
    try:
        assert not notify.deliver(receiver.url, {"event": "run.completed", "run": {"id": 3}}, backoff_s=0.01)
    finally:
        receiver.close()
    assert len(receiver.posts) == 1 and receiver.redirected == []
    (line,) = capsys.readouterr().err.strip().splitlines()
    port = receiver.url.split(":")[2].split("/")[0]
    assert line == (f"parallax: webhook http://127.0.0.1:{port}/… did not take the run.completed message of run 3 after "
                    f"1 try: HTTP {code}, a redirect to http://127.0.0.1:{port}/…: not followed (it would post the message "
                    "again without its body); give the webhook's final URL")


class Trickling:
    """A TCP server on 127.0.0.1 that reads a request, then sends ``head`` at once and ``trickle`` one byte every
    ``pause_s``, for as long as the client stays."""

    def __init__(self, head: bytes, trickle: bytes, pause_s: float = 0.2):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.head, self.trickle, self.pause_s = head, trickle, pause_s
        self.served = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hooks/{SECRET}"

    def _serve(self):
        with contextlib.suppress(OSError):
            connection, _ = self.listener.accept()
            with connection:
                connection.recv(65536)
                self.served.set()
                connection.sendall(self.head)
                for byte in self.trickle:
                    connection.sendall(bytes([byte]))
                    time.sleep(self.pause_s)

    def close(self):
        self.listener.close()


def test_a_receiver_answering_a_byte_at_a_time_is_cut_at_the_deadline(capsys):
    # Each byte comes well within the per-read timeout: urllib waited for the whole 12 s answer (and the 60
    # bytes of a longer one, for as long as the receiver liked).
    receiver = Trickling(b"", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + b"X-Slow: " + b"." * 20 + b"\r\n\r\n")
    started = time.monotonic()
    try:
        assert not notify.deliver(receiver.url, {"event": "run.failed", "run": {"id": 5}}, attempts=1, timeout_s=1.0)
    finally:
        receiver.close()
    took_s = time.monotonic() - started
    assert receiver.served.is_set()
    assert took_s < 4.0, took_s  # the bound is 1 s; the rest is slack for a loaded machine, not the 12 s answer
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith("did not take the run.failed message of run 5 after 1 try: no whole answer within 1 s"), line


def test_an_answer_whose_body_trickles_is_taken_at_its_status_without_waiting_for_the_body():
    receiver = Trickling(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"." * 100)
    started = time.monotonic()
    try:
        assert notify.deliver(receiver.url, {"event": "run.completed"}, attempts=1, timeout_s=1.0)
    finally:
        receiver.close()
    assert time.monotonic() - started < 4.0


# URLs the HTTP library refuses or cannot read, each holding the secret in the part that must stay unsaid.
UNSENDABLE = {
    "space": f"http://127.0.0.1:9/hooks/{SECRET} x",
    "control": f"http://127.0.0.1:9/hooks/{SECRET}\x01",
    "not ascii": f"http://127.0.0.1:9/hooks/{SECRET}é",
    "bad port": f"http://127.0.0.1:99999/hooks/{SECRET}",
    "port not a number": f"http://127.0.0.1:x{SECRET}/hooks",
    "unclosed bracket": f"http://[::1/hooks/{SECRET}",
}


@pytest.mark.parametrize("url", list(UNSENDABLE.values()), ids=list(UNSENDABLE))
def test_a_url_the_http_library_refuses_is_said_by_scheme_and_host_only_and_leaves_no_traceback(
        url, engine, parallax_home, monkeypatch, capsys):
    uncaught = []
    monkeypatch.setattr(threading, "excepthook", lambda args: uncaught.append(args.exc_value))
    monkeypatch.setenv(notify.WEBHOOKS_ENV, url)
    run_id = store.create_run(engine, {"dataset": "digits", "model": "resnet18", "strategy": "single"}, status="running")
    for thread in notify.notify(engine, run_id, "run.failed", "a reason"):
        thread.join(timeout=30)
    with pytest.raises(ValueError) as refused:  # the Settings page's check, at saving
        notify.save_webhooks([url])
    logged = capsys.readouterr().err
    said = logged + str(refused.value) + "".join(map(repr, uncaught))
    assert not uncaught and "Traceback" not in said
    assert "SECRET" not in said and "hooks" not in said, said
    (line,) = logged.strip().splitlines()
    assert line == f"parallax: the run.failed message of run {run_id} was not sent: {refused.value}", line
    assert not (parallax_home / notify.WEBHOOKS_FILE).exists()

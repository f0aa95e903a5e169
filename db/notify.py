"""Telling people when a run ends, diverges or stalls: a POST to each configured webhook.

    PARALLAX_WEBHOOKS=https://hooks.slack.com/services/T0/B0/XXXX,http://127.0.0.1:9000/parallax

Links in messages point to ``PARALLAX_DASHBOARD_URL``, else to the address the home's dashboard was last started
on (it records it as it starts, ``$PARALLAX_HOME/dashboard-url``), else to http://127.0.0.1:8501.

The webhooks of a home are the comma-separated URLs in ``PARALLAX_WEBHOOKS`` and the lines of
``$PARALLAX_HOME/webhooks`` (written by the dashboard's Settings, readable by its owner only). A URL
carries its secret (Slack's and Discord's do, in their path), so URLs are read when a message is sent
and never stored in the database or written to a log: a failed delivery names the URL's scheme and
host only.

Each message is one JSON object that three kinds of receiver read: generic fields (``event``, ``run``:
id, link, status, reason, strategy, model, dataset, best accuracy, duration), Slack's ``text`` and
Discord's ``content`` (the same one line). ``event`` is ``run.completed``, ``run.failed``,
``run.cancelled``, ``run.lost``, ``run.pruned`` (a search's trial ended early by its pruner), ``run.diverged`` (a NaN loss the run trained on, ``--on-nonfinite
warn``; one that stops it is ``run.failed`` with that reason) or ``run.stalled``.

Delivery never holds up the caller: each message gets a thread for each URL, which waits for the
process's previous message of the same run to that URL (so a run's messages arrive in order) and tries up to
``ATTEMPTS`` times, each try ending within ``TIMEOUT_S`` of wall-clock time however slowly the receiver
answers (webhook_post.py), waiting ``BACKOFF_S`` between tries; the process waits for those threads at
exit, so it ends at most about 20 s later when a receiver is down or slow. A redirect is not followed:
the delivery fails at once, and its line in the log says where the receiver redirects (scheme, host and port).
``lifecycle.finish`` sends the end of every run, from whichever process records it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from urllib.parse import urlsplit

from sqlalchemy import Engine, func, select

from contract.python_process import WEBHOOK_THREAD_NAME
from db.connection import session_scope
from db.tables import EpochMetric, Run
from db.webhook_post import post_json, shown_url, url_problem

WEBHOOKS_ENV = "PARALLAX_WEBHOOKS"
WEBHOOKS_FILE = "webhooks"  # in PARALLAX_HOME, one URL a line
DASHBOARD_URL_ENV = "PARALLAX_DASHBOARD_URL"  # where links in messages point
# In PARALLAX_HOME: the address the home's dashboard was last started on (``parallax ui --port``), which links use
# unless PARALLAX_DASHBOARD_URL says otherwise; the default where no dashboard has started yet.
DASHBOARD_URL_FILE = "dashboard-url"
DEFAULT_DASHBOARD_URL = "http://127.0.0.1:8501"
MAX_URL_LENGTH = 2048
ATTEMPTS, TIMEOUT_S, BACKOFF_S = 3, 5.0, 1.0
EVENTS = ("run.completed", "run.failed", "run.cancelled", "run.lost", "run.pruned", "run.diverged", "run.stalled")


def webhook_urls() -> list[str]:
    """This home's webhooks: ``PARALLAX_WEBHOOKS`` first, then the Settings file; each once."""
    urls = [u.strip() for u in os.environ.get(WEBHOOKS_ENV, "").split(",")]
    try:
        urls += settings_webhooks()
    except ValueError:
        pass  # no usable home: the variable alone
    return list(dict.fromkeys(u for u in urls if u))


def settings_webhooks() -> list[str]:
    """The webhooks the dashboard's Settings keep in ``$PARALLAX_HOME/webhooks``."""
    from contract.environment import parallax_home

    try:
        lines = (parallax_home() / WEBHOOKS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def save_webhooks(urls: list[str]) -> None:
    """Replace the Settings webhooks with ``urls`` (each checked first; ValueError names a bad one), in a
    file only its owner can read: the URLs hold their secrets."""
    from contract.environment import parallax_home

    checked = [check_webhook_url(url) for url in urls if url.strip()]
    path = parallax_home() / WEBHOOKS_FILE
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # a file left by an older version keeps no wider mode
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write("".join(f"{url}\n" for url in checked))


def send_test_message() -> dict[str, bool]:
    """Post a test message to every webhook of the home now; which took it, by shown URL."""
    message = {"event": "test", "text": "Parallax: a test message from the dashboard's Settings.",
               "content": "Parallax: a test message from the dashboard's Settings.", "run": None}
    return {shown_url(url): deliver(url, message, attempts=1) for url in webhook_urls()}


def check_webhook_url(url: str) -> str:
    """``url`` if Parallax can post to it (an http(s) URL with a host that an HTTP request can carry as it is),
    else ValueError naming it by scheme, host and port only."""
    problem = url_problem(url.strip())
    if problem is not None:
        raise ValueError(f"webhook {shown_url(url.strip())!r} {problem}")
    return url.strip()


def dashboard_url() -> tuple[str, str]:
    """(Where links in messages point, where that comes from): ``PARALLAX_DASHBOARD_URL``, else the address the
    home's dashboard was last started on, else the default address."""
    given = os.environ.get(DASHBOARD_URL_ENV, "").strip()
    if given:
        return given.rstrip("/"), DASHBOARD_URL_ENV
    from contract.environment import parallax_home

    try:
        with open(parallax_home() / DASHBOARD_URL_FILE, encoding="utf-8") as handle:
            recorded = handle.read(MAX_URL_LENGTH).strip()
    except (OSError, ValueError, UnicodeDecodeError):  # none started yet, or no usable home
        recorded = ""
    if urlsplit(recorded).scheme in ("http", "https") and urlsplit(recorded).hostname:
        return recorded.rstrip("/"), "the dashboard as it was last started"
    return DEFAULT_DASHBOARD_URL, "the default address; no dashboard has started on this home"


def record_dashboard_url(url: str) -> None:
    """Keep ``url`` as the address links point to (the dashboard calls this as it starts), replaced whole."""
    from contract.environment import parallax_home

    path = parallax_home() / DASHBOARD_URL_FILE
    partial = path.with_name(f".{DASHBOARD_URL_FILE}.{os.getpid()}")
    partial.write_text(f"{url[:MAX_URL_LENGTH]}\n", encoding="utf-8")
    os.replace(partial, path)


def run_message(engine: Engine, run_id: int, event: str, reason: str | None = None) -> dict:
    """The JSON object posted for ``event`` of run ``run_id``, read from the database now."""
    with session_scope(engine) as session:
        run = session.get(Run, run_id)
        best = session.scalar(select(func.max(EpochMetric.val_acc)).where(EpochMetric.run_id == run_id))
        ended = run.finished_at or run.heartbeat_at
        duration_s = (ended - run.started_at).total_seconds() if run.started_at and ended else None
        facts = {"status": run.status, "error": run.error, "strategy": run.strategy, "model": run.model,
                 "dataset": run.dataset, "tags": list(run.tags or [])}
    reason = reason if reason is not None else facts.pop("error")
    facts.pop("error", None)
    link = f"{dashboard_url()[0]}/run?run={run_id}"
    headline = reason.strip().splitlines()[0] if reason and reason.strip() else ""
    line = (f"Parallax run #{run_id} ({facts['strategy']}, {facts['model']} on {facts['dataset']}) "
            f"{event.removeprefix('run.')}" + (f": {headline}" if headline else "")
            + (f" (best validation accuracy {best:.1%})" if best is not None else "") + f" {link}")
    return {"event": event, "text": line, "content": line[:2000],
            "run": {"id": run_id, "link": link, "reason": reason, "best_val_acc": best, "duration_s": duration_s,
                    **facts}}


def notify(engine: Engine, run_id: int, event: str, reason: str | None = None) -> list[threading.Thread]:
    """Post ``event`` of run ``run_id`` to every webhook of the home, in the background; the threads, for a
    caller that wants to wait. Never raises: a notification must not change how a run ends."""
    urls = webhook_urls()
    if not urls:
        return []
    try:
        message = run_message(engine, run_id, event, reason)
    except Exception as exc:  # the run's end is recorded; a message it cannot build is said, not raised
        print(f"parallax: no notification for run {run_id} ({event}): {type(exc).__name__}: {exc}", file=sys.stderr)
        return []
    threads = []
    with _ORDER:  # each URL takes a run's messages in the order they were sent (its end last)
        for url in urls:
            previous = _LAST_DELIVERY.get((url, run_id))
            thread = threading.Thread(target=_deliver_after, args=(previous, url, message), name=WEBHOOK_THREAD_NAME)
            try:
                thread.start()
            except RuntimeError as exc:  # no thread to be had: said, and the run goes on
                print(f"parallax: no notification for run {run_id} ({event}): {exc}", file=sys.stderr)
                continue
            _LAST_DELIVERY[(url, run_id)] = thread
            threads.append(thread)
        for key in [key for key, thread in _LAST_DELIVERY.items() if not thread.is_alive()]:
            del _LAST_DELIVERY[key]  # delivered: nothing left to wait for
    return threads


_ORDER = threading.Lock()
# Per webhook and run, the delivery that run's next message waits for. Runs apart are not ordered,
# so a receiver that is down holds up one run's few messages, not every run's.
_LAST_DELIVERY: dict[tuple[str, int], threading.Thread] = {}


def _deliver_after(previous: threading.Thread | None, url: str, message: dict) -> None:
    if previous is not None:
        previous.join()
    try:
        deliver(url, message)
    except Exception as exc:  # noqa: BLE001 - a thread's traceback could quote the URL: its type, in one line
        print(f"parallax: webhook {shown_url(url)} was not told of run {(message.get('run') or {}).get('id')}: "
              f"{type(exc).__name__}", file=sys.stderr, flush=True)


def deliver(url: str, message: dict, *, attempts: int = ATTEMPTS, timeout_s: float = TIMEOUT_S,
            backoff_s: float = BACKOFF_S) -> bool:
    """POST ``message`` to ``url``, up to ``attempts`` times, each within ``timeout_s``; whether it was taken (a
    2xx answer). Never raises, and says nothing of the URL but its scheme, host and port."""
    run_id = (message.get("run") or {}).get("id")
    try:
        check_webhook_url(url)
    except ValueError as exc:
        print(f"parallax: the {message.get('event')} message of run {run_id} was not sent: {exc}", file=sys.stderr,
              flush=True)
        return False
    body = json.dumps(message).encode()
    for attempt in range(1, attempts + 1):
        answer = post_json(url, body, deadline_s=timeout_s)
        if answer.taken:
            return True
        if not answer.retry:
            break
        if attempt < attempts:
            time.sleep(backoff_s * attempt)
    print(f"parallax: webhook {shown_url(url)} did not take the {message.get('event')} message of run "
          f"{run_id} after {attempt} tr{'ies' if attempt > 1 else 'y'}: {answer.problem}", file=sys.stderr, flush=True)
    return False

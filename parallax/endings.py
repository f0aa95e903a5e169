"""How a script's run learns that the script ended: an uncaught exception (``sys.excepthook``), SIGINT or
SIGTERM (signal handlers), ``sys.exit(code)`` / ``exit(code)`` / ``quit(code)`` (wrapped, to note the code),
or the interpreter exiting (``atexit``). Installed once per process, the first time ``init`` runs (signal
handlers only from the main thread, where Python allows them); each hands on to what was there before, so
the script's own handlers and torchrun's behave as without Parallax.

``atexit`` cannot see the exit status, and Python calls no hook for ``SystemExit``: the code is noted where
the script asks to exit. A ``raise SystemExit(code)`` written out by hand outside a ``with parallax.init(...)``
block is not seen, and the run ends completed (docs/OWN_SCRIPT.md)."""

from __future__ import annotations

import atexit
import builtins
import os
import signal
import sys
import threading
import traceback

_active: list = []  # the run being logged in this process (at most one)
_installed = False
_previous_hook = None
_previous_handlers: dict[int, object] = {}
SIGNALS = ("SIGINT", "SIGTERM")
SIGNAL_FLUSH_S = 5.0  # a cancelled script writes what it can this long, inside cancel's grace period
_NO_EXIT = object()
_exit_code = [_NO_EXIT]  # what the main thread last asked sys.exit/exit/quit to exit with


def failure_text(exc_type, exc, tb) -> str:
    """The exception's last line first (the Run page's headline), then the traceback."""
    last = traceback.format_exception_only(exc_type, exc)[-1].strip()
    return f"{last}\n{''.join(traceback.format_exception(exc_type, exc, tb))}"


def exit_reason(code) -> str | None:
    """Why a run whose script exited with ``code`` (``SystemExit.code``) failed, or None where it did not:
    as Python decides the process's status, None and 0 are success, an int is the status, anything else
    (a message) is printed and the status is 1."""
    if code is None or (isinstance(code, int) and code == 0):
        return None
    if isinstance(code, int):
        return f"the script exited with code {int(code)}"
    return f"the script exited with code 1: {code}"


def track(run, *, hooks: bool = True) -> None:
    """``run`` is this process's run from now on; the hooks are installed on first use (``hooks``: a run
    that records nothing needs none)."""
    _active[:] = [run]
    if hooks:
        _install()


def forget(run) -> None:
    if _active and _active[0] is run:
        _active.clear()


def current():
    return _active[0] if _active else None


def _forget_in_child() -> None:
    # A forked child (a DataLoader worker) is not the script: a SIGTERM its parent's DataLoader sends it at
    # shutdown, or its own exit, must not end the run.
    _active.clear()
    _exit_code[0] = _NO_EXIT


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _install() -> None:
    global _installed, _previous_hook
    if _installed:
        return
    _installed = True
    _previous_hook = sys.excepthook
    sys.excepthook = _on_uncaught
    sys.exit = _NotingExit(sys.exit)
    for name in ("exit", "quit"):  # site's; absent under `python -S`
        if callable(getattr(builtins, name, None)):
            setattr(builtins, name, _NotingExit(getattr(builtins, name)))
    atexit.register(_on_exit)
    if threading.current_thread() is threading.main_thread():
        for name in SIGNALS:
            number = getattr(signal, name)
            _previous_handlers[number] = signal.getsignal(number)
            signal.signal(number, _on_signal)


def _on_uncaught(exc_type, exc, tb) -> None:
    run = current()
    if run is not None:
        if issubclass(exc_type, KeyboardInterrupt):
            run.end("cancelled", "cancelled by KeyboardInterrupt (Ctrl-C)")
        else:
            run.end("failed", failure_text(exc_type, exc, tb))
    (_previous_hook or sys.__excepthook__)(exc_type, exc, tb)


class _NotingExit:
    """``sys.exit`` (or site's ``exit``/``quit``) as before, noting the code first where the main thread
    calls it (elsewhere it only ends that thread). A script that catches the SystemExit and ends otherwise
    has its later end recorded instead (finish, an exception, a signal), or else the noted code."""

    def __init__(self, original) -> None:
        self._original = original

    def __call__(self, code=None):
        if threading.current_thread() is threading.main_thread():
            _exit_code[0] = code
        return self._original(code)

    def __repr__(self) -> str:
        return repr(self._original)


def _on_exit() -> None:
    run = current()
    if run is None:
        return
    code = _exit_code[0]
    reason = None if code is _NO_EXIT else exit_reason(code)
    if reason is None:  # the script ended without finish(), or exited with 0: as W&B, the run is complete
        run.finish()
    else:
        run.end("failed", reason)


def _on_signal(number: int, frame) -> None:
    run = current()
    if run is not None:
        run.end("cancelled", f"cancelled by {signal.Signals(number).name}", wait_s=SIGNAL_FLUSH_S)
    previous = _previous_handlers.get(number)
    if callable(previous):
        previous(number, frame)  # Python's own SIGINT handler raises KeyboardInterrupt here
    elif previous == signal.SIG_IGN:
        return
    else:  # the default: end by the signal, as the script would have without Parallax
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)

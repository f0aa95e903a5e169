"""How Parallax starts Python processes of its own: the same program from whatever folder it is started in.

    subprocess.Popen(python_command("-m", "trainer_backend", "supervisor", "7"), env=safe_path_env(env))
    os.execv(sys.executable, python_command("-m", "ui.auth", "hash-password"))

``python -m module`` puts the current folder first on the import path, so a user's own ``db/``,
``ui/``, ``reports/`` or ``trainer_backend/`` package there would be imported in place of
Parallax's, and the command would die. Python 3.11's ``-P`` (``PYTHONSAFEPATH`` for processes
that a tool such as torchrun starts) leaves that folder out; on 3.10, which has neither, a module
is run through ``runpy`` after dropping the folder ``-c`` put first. The command line still reads
``… -m trainer_backend supervisor N`` on 3.11 (the form ``lifecycle.is_run_process`` recognises) and
``… -c <starter> trainer_backend supervisor N`` on 3.10.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from typing import NoReturn

SAFE_PATH = sys.version_info >= (3, 11)
# Python 3.10: ``-c`` puts '' (the current folder) first; drop it, then run the module as -m would.
_START_MODULE = ("import runpy, sys; del sys.path[0]; del sys.argv[0]; "
                 "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


def python_command(*args: str) -> list[str]:
    """``[python, *args]`` (``-m module …`` or a script path) that never imports from the current folder."""
    if SAFE_PATH:
        return [sys.executable, "-P", *args]
    if args[:1] == ("-m",):
        return [sys.executable, "-c", _START_MODULE, *args[1:]]
    return [sys.executable, *args]  # a script: Python puts the script's own folder first, not the current one


def safe_path_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a process that starts Python processes of its own (torchrun's agent, its ranks)."""
    return {**env, "PYTHONSAFEPATH": "1"}


WEBHOOK_THREAD_NAME = "parallax-webhook"  # each delivery of a message to a webhook (db/notify.py)
THREADS_WAIT_S = 60.0  # a webhook's three tries take about 20 s; a run's messages behind one another, a few of those


def leave_without_shutdown(code: int) -> NoReturn:
    """End a rank process that has recorded all it has to, with ``code``, skipping interpreter shutdown.

    Shutting the interpreter down would garbage-collect torch's objects one by one, then run the C++
    destructors of collective state left for exit: on gloo with FSDP one of those can abort the
    process ("terminate called without an active exception", about one run in six on 2 CPU ranks),
    which the runner, or torchrun, must read as a crashed rank. As shutdown would, it first waits for
    the webhook messages still being delivered (db/notify.py's threads), up to ``THREADS_WAIT_S``; not
    for other threads, such as the idle workers of torch.compile's pool, which only shutdown ends.
    Output is flushed; atexit handlers do not run."""
    deadline = time.monotonic() + THREADS_WAIT_S
    for thread in threading.enumerate():
        if thread.name == WEBHOOK_THREAD_NAME:
            thread.join(max(0.0, deadline - time.monotonic()))
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream cannot change the exit code
            stream.flush()
    logging.shutdown()
    os._exit(code)

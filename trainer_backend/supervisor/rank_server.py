"""The server that forks a run's CPU ranks, started as a fork of the process that runs the run.

    runner (engine imported) ──fork──▶ rank server ──fork──▶ rank 0, rank 1, …

``torch.multiprocessing`` starts CPU ranks with the ``forkserver`` method: a server process that
forks each rank, so that no rank imports the training code itself. Python starts that server afresh
(a new interpreter, which imports the training code again: about 4 s of CPU, as much as the runner's own
start). The runner has already imported everything a rank needs, so it hands the server over
instead: ``start_rank_server`` forks it from the runner, before the run has started a thread or
run an operator (a fork is only safe then), and multiprocessing's own server loop runs in it. The
ranks then fork from a copy of the runner's loaded engine, and share its pages with the runner.

It is taken only where it is safe and known to fit (can_fork_server): on a platform with
``fork``, in a process that has started no thread since it imported the training code and has not
initialised CUDA, and on a Python whose forkserver takes no authentication key (3.14 added one).
The runner closes its database connections first (db.dispose_engines). Anywhere else, or where
a step of the start fails, nothing is started here and multiprocessing starts its own server,
with the training code as its preload (runner.RANK_PRELOAD), as before.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing import connection, forkserver, resource_tracker, util


def _native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # no /proc: only Python's own count is known
        return threading.active_count()


# The threads of this process once the training code is imported (this module is imported with it): the
# main one, and the pool of numpy's OpenBLAS, which stops its threads before any fork
# (pthread_atfork) and starts them again when next used, as a DataLoader's forked workers rely on.
THREADS_AT_IMPORT = _native_threads()


def can_fork_server() -> bool:
    """Whether this process may fork the rank server now: no Python thread but this one (a fork
    copies no other thread, so a lock one holds would stay held in the copy), no native thread
    started since the training code was imported (torch's OpenMP pool starts with the first operator run
    on several threads, and a rank forked after it hangs in its own first one), CUDA not
    initialised, and a forkserver of the shape this module drives."""
    if not hasattr(os, "fork") or threading.active_count() != 1 or _native_threads() > THREADS_AT_IMPORT:
        return False
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return False
    server = forkserver._forkserver
    return (not hasattr(server, "_forkserver_authkey")
            and all(hasattr(server, name) for name in ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid")))


def start_rank_server(before_fork: Callable[[], None] = lambda: None) -> int | None:
    """Fork the forkserver of this process's CPU ranks from this process; its pid, or None where
    nothing was started: one runs already, forking is not safe here, or a step of the start failed
    (a full disk under stdout, no memory left to fork). Multiprocessing then starts its own when
    the ranks are started, as it always did: this is a saving, never a reason for a run to fail.
    ``before_fork`` runs only where a fork follows (the runner closes its database connections)."""
    server = forkserver._forkserver
    if server._forkserver_pid is not None or not can_fork_server():
        return None
    before_fork()
    try:
        # What is buffered here would otherwise be written again by each rank.
        sys.stdout.flush()
        sys.stderr.flush()
        resource_tracker.ensure_running()  # before the fork, so that the server and its ranks share it
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            # Every process that starts ranks holds the write end; the server ends at its EOF.
            alive_r, alive_w = os.pipe()
            try:
                pid = os.fork()
            except OSError:
                os.close(alive_r)
                os.close(alive_w)
                raise
            if pid == 0:
                _serve(listener.fileno(), alive_r, alive_w)  # never returns
            os.close(alive_r)
    except OSError:
        return None
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    return pid


def _serve(listener_fd: int, alive_r: int, alive_w: int) -> None:
    """The forked server: multiprocessing's loop, which ends when every holder of ``alive_w`` has."""
    code = 1
    try:
        os.close(alive_w)
        _signals_as_started()
        forkserver.main(listener_fd, alive_r, [])  # nothing to preload: the training code is here already
    except SystemExit:
        code = 0
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _signals_as_started() -> None:
    """The signal handlers a new interpreter starts with, which a forked rank would otherwise take
    from the command that forked its server: no Python handler but SIGINT's, and SIGPIPE ignored,
    so that a rank writing to a closed log gets an error it handles (logguard) instead of dying
    (the CLI restores SIGPIPE's default for itself, __main__.py)."""
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)

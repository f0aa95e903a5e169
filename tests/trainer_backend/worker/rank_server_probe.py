"""Run by test_rank_server.py, in a process of its own: load the engine and start the rank server
as a run's runner does, fork two ranks through torch.multiprocessing, and print what the server
and the ranks are. ``--thread``: with a second Python thread alive when the server is asked for."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import torch.multiprocessing as mp


def rank(index: int, out: str) -> None:
    facts = {"ppid": os.getppid(),
             "sigpipe_ignored": signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,
             "sigusr1_default": signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL,
             "engine_loaded": {"timm", "trainer_backend.worker.runner"} <= sys.modules.keys()}
    with open(os.path.join(out, f"rank{index}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)
    sys.stdout.flush()  # as runner._rank_main does before it leaves


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as file:
        return file.read().decode().replace("\0", " ").strip()


def main(out: str, with_thread: bool) -> None:
    from multiprocessing import forkserver

    from trainer_backend.contract.startup import engine_imports

    with engine_imports():
        import trainer_backend.worker.runner  # noqa: F401
    from trainer_backend.worker.rank_server import start_rank_server

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as the CLI sets it for itself
    signal.signal(signal.SIGUSR1, lambda *_: None)  # a handler of the runner's own
    stop = threading.Event()
    if with_thread:
        threading.Thread(target=stop.wait, daemon=True).start()
    # Block-buffered, as a pipe is unless PYTHONUNBUFFERED is set: still in the buffer at the fork.
    sys.stdout = open(sys.stdout.fileno(), "w", buffering=65536, encoding="utf-8", closefd=False)
    print("buffered before the fork;", end="")
    forked = start_rank_server()
    mp.start_processes(rank, args=(out,), nprocs=2, start_method="forkserver")
    stop.set()
    server = forkserver._forkserver._forkserver_pid
    print("\n" + json.dumps({"forked": forked, "server": server, "server_cmdline": cmdline(server),
                      "own_cmdline": cmdline(os.getpid())}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], "--thread" in sys.argv[2:])

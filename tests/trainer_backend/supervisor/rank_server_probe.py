"""Run by test_rank_server.py, in a process of its own: load the training code, open a database and start
the rank server as a run's runner does (runner._fork_rank_server for a ddp run on two CPU
processes), fork two ranks through torch.multiprocessing, and print what the server and the ranks
are. ``--thread``: with a second Python thread alive when the server is asked for; ``--operator``:
after this process has run an operator on two threads (torch's OpenMP pool is up)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import torch.multiprocessing as mp


def rank(index: int, out: str, database: str) -> None:
    open_files = {os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")}
    facts = {"ppid": os.getppid(),
             "sigpipe_ignored": signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,
             "sigusr1_default": signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL,
             "engine_loaded": {"timm", "trainer_backend.supervisor.runner"} <= sys.modules.keys(),
             "database_files_open": sorted(path for path in open_files if path.startswith(database))}
    with open(os.path.join(out, f"rank{index}.json"), "w", encoding="utf-8") as file:
        json.dump(facts, file)
    sys.stdout.flush()  # as runner._rank_main does before it leaves


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as file:
        return file.read().decode().replace("\0", " ").strip()


def main(out: str, flags: list[str]) -> None:
    from multiprocessing import forkserver

    from trainer_backend.supervisor.startup import engine_imports

    with engine_imports():
        from trainer_backend.supervisor import runner
    import torch

    from db import make_engine, store
    from contract.config import RunConfig

    database = os.path.join(out, "parallax.db")
    store.list_runs(make_engine(f"sqlite:///{database}"))  # an open, pooled connection, as the supervisor has
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as the CLI sets it for itself
    signal.signal(signal.SIGUSR1, lambda *_: None)  # a handler of the runner's own
    stop = threading.Event()
    if "--thread" in flags:
        threading.Thread(target=stop.wait, daemon=True).start()
    if "--operator" in flags:
        torch.set_num_threads(2)
        torch.nn.functional.conv2d(torch.randn(8, 3, 64, 64), torch.randn(16, 3, 3, 3))
    # Block-buffered, as a pipe is unless PYTHONUNBUFFERED is set: still in the buffer at the fork.
    sys.stdout = open(sys.stdout.fileno(), "w", buffering=65536, encoding="utf-8", closefd=False)
    print("buffered before the fork;", end="")
    forked = runner._fork_rank_server(RunConfig(strategy="ddp", devices=("cpu", "cpu")))
    mp.start_processes(rank, args=(out, database), nprocs=2, start_method="forkserver")
    stop.set()
    server = forkserver._forkserver._forkserver_pid
    print("\n" + json.dumps({"forked": forked, "server": server, "server_cmdline": cmdline(server),
                             "own_cmdline": cmdline(os.getpid())}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

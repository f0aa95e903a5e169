"""The ``parallax`` command: the dashboard, Parallax's command line and the chores, from any directory.

    parallax ui [--address 127.0.0.1] [--port 8501]    # the dashboard, served as `make run` serves it
    parallax run --dataset digits --epochs 1          # and launch, sweep, cancel, export, list: see --help
    parallax hash-password                            # the secrets.toml lines for a dashboard password
    parallax db upgrade [--db URL]                    # migrate a database to this version's schema
    parallax sync FILE [--db URL]                     # put an offline script run (import parallax) in the database

``parallax run …`` is ``python -m trainer_backend run …``; Parallax's own processes (a launched run's supervisor,
its ranks, torchrun's ranks) keep starting through ``python -m trainer_backend``, which works wherever Parallax is
installed or checked out. Every Python process Parallax starts (the dashboard's server, hash-password, a supervisor)
leaves the current folder off its import path (``contract.python_process``): a folder holding packages of its own
named ``db``, ``ui`` or ``reports`` runs the same commands as any other.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from contract.python_process import python_command

USAGE = """usage: parallax COMMAND ...

  ui              serve the dashboard (--address, --port; default 127.0.0.1:8501)
  run             train in the foreground; ends with 'run_id=N status=S'
  launch          start a run in the background
  sweep           run one config under several strategies
  search          search fields for the best accuracy, or the fastest settings that fit (--speed)
  cancel          stop a queued or running run
  export          print a run as JSON (or --csv FOLDER)
  list            one line per run, newest first, with best accuracy and images/s (--status, --tag, --json)
  predict         classify image files with a run's best checkpoint (or --folder FOLDER for an accuracy)
  hash-password   print the secrets.toml lines for a dashboard password
  db upgrade      migrate the database (--db URL, else PARALLAX_DB_URL or PARALLAX_HOME's SQLite) to this version
  sync            put the run file of a script's offline run (parallax.init(mode="offline")) in the database

'parallax COMMAND --help' says more about each engine command.
"""


def app_folder() -> Path:
    """The folder holding the dashboard's ``app.py``, ``pages/`` and ``.streamlit/config.toml``: the checkout this
    module lives in, else (installed from a wheel) the ``parallax_app`` package beside it."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "app.py").is_file():
        return checkout
    spec = importlib.util.find_spec("parallax_app")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / "app.py").is_file():
            return Path(location)
    raise SystemExit("error: the dashboard's app.py is not installed beside trainer_backend: reinstall Parallax")


def serve_ui(argv: list[str]) -> int:
    """Replace this process with Streamlit serving ``app.py``. Everything about how it serves (headless, no file
    watcher, XSRF) is in the ``.streamlit/config.toml`` beside ``app.py``, which Streamlit reads whatever the
    working directory: ``make run``, ``parallax ui`` and ``streamlit run app.py`` serve the same program. Other
    Streamlit options (``--secrets.files F``) are passed on as they are."""
    parser = argparse.ArgumentParser(prog="parallax ui", description="serve the Parallax dashboard",
                                     epilog="Other options are Streamlit's, passed on (e.g. --secrets.files F).")
    parser.add_argument("--address", default=None, help="address to listen on (default 127.0.0.1, from the config)")
    parser.add_argument("--port", type=int, default=None, help="port to listen on (default 8501)")
    args, streamlit_options = parser.parse_known_args(argv)
    app = app_folder() / "app.py"
    command = python_command("-m", "streamlit", "run", str(app))
    if args.address:
        command += ["--server.address", args.address]
    if args.port is not None:
        command += ["--server.port", str(args.port)]
    sys.stdout.flush()
    os.execv(sys.executable, [*command, *streamlit_options])
    return 0  # not reached


def upgrade_database(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="parallax db", description="migrate a Parallax database")
    parser.add_argument("action", choices=["upgrade"], help="upgrade: apply every migration this version has")
    parser.add_argument("--db", help="SQLAlchemy database URL (default: PARALLAX_DB_URL, else SQLite in PARALLAX_HOME)")
    args = parser.parse_args(argv)
    from db.access import DatabaseUnavailable, open_database
    from db.connection import current_revisions, masked_url

    try:
        engine = open_database(args.db)  # opening a database migrates it to head, under a lock
    except (DatabaseUnavailable, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{masked_url(engine.url)} is at revision {', '.join(sorted(current_revisions(engine)))}")
    return 0


def sync_offline_runs(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="parallax sync", description="put offline script runs in the database")
    parser.add_argument("files", nargs="+", metavar="FILE", help="a run file written by parallax.init(mode='offline')")
    parser.add_argument("--db", help="SQLAlchemy database URL (default: PARALLAX_DB_URL, else SQLite in PARALLAX_HOME)")
    args = parser.parse_args(argv)
    from db.access import DatabaseUnavailable, open_database
    from db.connection import DatabaseLockedError
    from db.offline_runs import sync_offline_file as sync

    try:
        engine = open_database(args.db)
    except (DatabaseUnavailable, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = 0
    for name in args.files:
        try:
            print(f"{name}: run_id={sync(name, engine)}")
        except (OSError, ValueError, DatabaseLockedError) as exc:  # the message names the file's line at fault
            print(f"error: {name}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "ui":
        return serve_ui(rest)
    if command == "hash-password":
        # The dashboard's own command, as `python -m ui.auth hash-password`: Parallax never imports the dashboard.
        os.execv(sys.executable, python_command("-m", "ui.auth", "hash-password", *rest))
    if command == "db":
        return upgrade_database(rest)
    if command == "sync":
        return sync_offline_runs(rest)
    # Every other command is Parallax's (run, launch, sweep, cancel, export, list …), whose parser names the
    # commands allowed. It runs as ``python -m trainer_backend`` would, in this process: the CUDA device order is
    # pinned before torch is imported (trainer_backend/__main__.py).
    import runpy

    sys.argv = ["parallax", *argv]
    try:
        runpy.run_module("trainer_backend", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

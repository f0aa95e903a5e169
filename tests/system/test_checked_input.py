"""Values from a config file, the environment, the address bar and id arguments are checked like
flags; far too many CPU processes are refused before any starts; a newer database, a --profile-dir
that is a file and a cancel that cannot signal end in one line; text users control is shown as
typed, never as Markdown, and never starts a formula in a CSV download.

    .venv/bin/python -m pytest tests/system/test_checked_input.py -q
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

import db
from tests.support import ROOT, run_cli
from db import store
from tests.trainer_backend.control.test_cli_bad_input import BASE, assert_nothing_left
from trainer_backend.control.cli import main
from contract.config import ConfigError, RunConfig, cpu_cores
from reports.spreadsheet import csv_cell, frame_for_csv
from ui.text import escape_markdown

APP = str(ROOT / "app.py")
TIMEOUT_S = 90
MOST_CPU = 4 * cpu_cores()
MANY_CPUS = ",".join(["cpu"] * 2000)


# --- config files, the environment, ids: one line, nothing left -------------------------------

# (id, --config file content or None, extra flags, environment, words the one line must hold)
CASES = [
    ("config-devices-number", {"devices": 5}, [], {}, ["devices 5 is not allowed", "list of device names"]),
    ("config-devices-float", {"devices": [1.5]}, [], {}, ["devices [1.5] is not allowed"]),
    ("config-tags-number", {"tags": 5}, [], {}, ["tags 5 is not allowed: give a list of strings"]),
    ("config-tags-string", {"tags": "abc"}, [], {}, ["tags 'abc' is not allowed: give a list of strings"]),
    ("config-tags-mixed", {"tags": ["a", 3]}, [], {}, ["tags ['a', 3] is not allowed"]),
    ("config-tags-too-many", {"tags": [f"t{i}" for i in range(65)]}, [], {}, ["at most 64 tags"]),
    ("config-bands-number", {"bands": 5}, [], {}, ["bands 5 must be comma-separated", "[3, 2, 1]"]),
    ("config-bands-bool", {"bands": [True]}, [], {}, ["bands [True] must be"]),
    ("config-bands-superscript", {"bands": "²"}, [], {}, ["bands '²' must be"]),
    ("config-bands-huge", {"bands": [10**30]}, [], {}, ["indices from 0 to 4095"]),
    ("config-batch-text", {"batch_size": "8"}, [], {}, ["batch_size '8' is not allowed", "1 to 65536"]),
    ("config-seed-huge", {"seed": 10**30}, [], {}, ["seed 1000000000000000000000000000000 is not allowed"]),
    ("config-not-an-object", [1, 2], [], {}, ["must hold a JSON object"]),
    ("config-unknown-field", {"epoch": 3}, [], {}, ["unknown config field(s) ['epoch']"]),
    ("env-cpu-runs-text", None, [], {"PARALLAX_CPU_RUNS": "abc"},
     ["PARALLAX_CPU_RUNS='abc' is not allowed", "whole number from 1 to 1024"]),
    ("env-cpu-runs-zero", None, [], {"PARALLAX_CPU_RUNS": "0"}, ["PARALLAX_CPU_RUNS='0'"]),
    ("env-max-images-superscript", None, [], {"PARALLAX_MAX_IMAGES": "²"}, ["PARALLAX_MAX_IMAGES='²'"]),
    ("env-lock-wait-inf", None, [], {"PARALLAX_DB_LOCK_WAIT_S": "inf"},
     ["PARALLAX_DB_LOCK_WAIT_S='inf' is not allowed", "below 1e9"]),
    ("env-home-is-a-file", None, [], {"PARALLAX_HOME": "/dev/null"},
     ["PARALLAX_HOME='/dev/null' cannot be used: File exists; it must be a folder"]),
    ("env-max-cpu-processes-text", None, ["--strategy", "ddp", "--devices", "cpu,cpu", "--batch-size", "8"],
     {"PARALLAX_MAX_CPU_PROCESSES": "lots"}, ["PARALLAX_MAX_CPU_PROCESSES='lots' is not allowed"]),
    ("cpu-processes-absurd", None, ["--strategy", "ddp", "--devices", MANY_CPUS, "--batch-size", "2000"], {},
     ["devices ask for 2000 CPU processes on one machine", f"use at most {MOST_CPU}"]),
    ("cpu-stages-absurd", None, ["--strategy", "mp", "--devices", MANY_CPUS], {},
     ["devices ask for 2000 CPU devices on one machine"]),
    ("device-list-absurd", None, ["--strategy", "ddp", "--devices", ",".join(["cpu"] * 5000)], {},
     ["devices lists 5000 entries, more than the 4096 allowed"]),
]


@pytest.mark.parametrize("case, config, flags, env, words", CASES, ids=[c[0] for c in CASES])
def test_config_file_environment_and_device_values_are_one_clear_line(case, config, flags, env, words, tmp_path,
                                                                       parallax_home, monkeypatch, capsys):
    argv = [*BASE, *flags]
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
        argv += ["--config", str(tmp_path / "config.json")]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], lines[0]
    assert time.monotonic() - started < 15
    assert_nothing_left(parallax_home)


@pytest.mark.parametrize("flags, words", [
    (["--target-acc", "nan"], "--target-acc nan is not allowed: give a validation accuracy in (0, 1]"),
    (["--target-acc", "5"], "--target-acc 5.0 is not allowed"),
    (["--report", "."], f"--report {os.getcwd()} is a folder: give the path of the HTML file to write"),  # made absolute
])
def test_sweep_flags_are_checked_before_any_run(flags, words, parallax_home, capsys):
    assert main(["sweep", "--strategies", "single,ddp", "--model", "test_resnet", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {words}"), err
    assert_nothing_left(parallax_home)


def test_config_file_lists_still_load():
    config = RunConfig.from_dict({"devices": ["cpu", "cpu"], "strategy": "ddp", "tags": [" a ", "", "b"],
                                  "bands": [3, 2, 1], "batch_size": 8})
    assert config.devices == ("cpu", "cpu") and config.tags == ("a", "b") and config.bands == (3, 2, 1)
    assert RunConfig.from_dict(config.to_dict()) == config
    assert RunConfig(bands="3, 2,1").bands == (3, 2, 1)


def test_cpu_processes_are_counted_per_machine(monkeypatch):
    with pytest.raises(ConfigError, match=f"more than the {MOST_CPU} allowed"):
        RunConfig(strategy="ddp", devices=("cpu",) * (MOST_CPU + 1), batch_size=MOST_CPU + 1)
    assert RunConfig(strategy="ddp", devices=("cpu",) * MOST_CPU, batch_size=MOST_CPU).world_size == MOST_CPU
    # A torchrun job over two machines runs half of its processes on each.
    RunConfig(strategy="ddp", devices=("cpu",) * (2 * MOST_CPU), batch_size=2 * MOST_CPU, nodes=2)
    monkeypatch.setenv("PARALLAX_MAX_CPU_PROCESSES", str(MOST_CPU + 4))
    RunConfig(strategy="ddp", devices=("cpu",) * (MOST_CPU + 4), batch_size=MOST_CPU + 4)


def own_session_processes(session_id: int) -> list[int]:
    """Processes still in the session the CLI led: what it spawned and left behind."""
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _sid(p) == session_id]


def _sid(proc: Path) -> int | None:
    with contextlib.suppress(OSError, IndexError, ValueError):
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[3])
    return None


def test_two_thousand_cpu_processes_are_refused_before_any_starts(parallax_home):
    """The real CLI, bounded: it must answer in seconds and leave no process behind."""
    env = {**os.environ, "PARALLAX_HOME": str(parallax_home), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "trainer_backend", "run", "--strategy", "ddp", "--devices",
                                MANY_CPUS, "--batch-size", "2000", "--model", "test_resnet"],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 2 and out == "", out + err
    assert err.strip() == (f"error: devices ask for 2000 CPU processes on one machine, more than the {MOST_CPU} "
                           f"allowed (4 per core, {cpu_cores()} cores; PARALLAX_MAX_CPU_PROCESSES sets another "
                           f"limit): use at most {MOST_CPU}")
    assert own_session_processes(process.pid) == []
    assert_nothing_left(parallax_home)


def test_a_bad_environment_variable_records_no_run(parallax_home):
    """Before: PARALLAX_CPU_RUNS=abc launched a run that then failed in its supervisor."""
    result = run_cli("launch", "--model", "test_resnet", "--epochs", "1", home=parallax_home, timeout=60,
                     env_extra={"PARALLAX_CPU_RUNS": "abc"})
    assert result.returncode == 2 and "run_id=" not in result.stdout
    assert result.stderr.strip() == ("error: PARALLAX_CPU_RUNS='abc' is not allowed: give a whole number from 1 to "
                                     "1024, e.g. 1")
    assert_nothing_left(parallax_home)


@pytest.mark.parametrize("command", ["cancel", "export"])
@pytest.mark.parametrize("raw", ["99999999999999999999999", str(2**63), "²", "0", "-3", "1e3"])
def test_an_id_a_database_cannot_hold_is_one_line(command, raw, parallax_home, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, raw])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"error: argument run_id: run id '{raw}' is not allowed: give a whole number from 1 to "
                          f"{2**63 - 1}")


def test_the_largest_id_is_looked_up_and_not_found(cli):
    result = cli("export", str(2**63 - 1), timeout=60)
    assert result.returncode == 2 and result.stderr.strip() == f"error: no run with id {2**63 - 1}"


@pytest.mark.parametrize("raw", ["²", "99999999999999999999999", "٣", "[x](https://evil.example)"])
def test_an_id_in_the_address_that_is_no_number_gets_a_message(raw, parallax_home, db_url):
    engine = db.make_engine(db_url)
    store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "single",
                              "devices": ["cpu"], "epochs": 1, "tags": []}, status="completed")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    at.query_params["run"] = raw
    at.switch_page("pages/run.py").run()
    assert not at.exception
    (error,) = [e.value for e in at.error]
    assert "in the address is not a run number" in error and "https://" not in error
    db.dispose_engines()


# --- a database from a newer Parallax -----------------------------------------------------------


def stamp_future_revision(home: Path) -> Path:
    database = home / "parallax.db"
    db.make_engine(f"sqlite:///{database}")
    db.dispose_engines()
    with contextlib.closing(sqlite3.connect(database)) as connection:
        connection.execute("update alembic_version set version_num = '9001_from_the_future'")
        connection.commit()
    return database


NEWER = "was written by a newer version of Parallax (schema revision 9001_from_the_future; this version knows up to "


def test_a_database_from_a_newer_parallax_is_one_line_on_the_cli(cli, parallax_home):
    database = stamp_future_revision(parallax_home)
    for command in (["list"], ["export", "1"], [*BASE]):
        result = cli(*command, timeout=60)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.strip().startswith(f"error: the database sqlite:///{database} {NEWER}"), result.stderr
    with contextlib.closing(sqlite3.connect(database)) as connection:  # left as it was
        assert connection.execute("select version_num from alembic_version").fetchall() == [("9001_from_the_future",)]


def test_a_database_from_a_newer_parallax_is_one_line_in_the_dashboard(parallax_home):
    stamp_future_revision(parallax_home)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    assert not at.exception
    (message,) = [e.value for e in at.error]
    assert NEWER in message and "open it with that version or a newer one" in message
    db.dispose_engines()


# --- export --profile-dir onto a file -----------------------------------------------------------


@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_profile_dir_that_is_a_file_is_one_line_and_writes_nothing(where, tmp_path, cli, parallax_home):
    target = tmp_path / "report.txt"
    target.write_text("keep me")
    engine = db.make_engine(f"sqlite:///{parallax_home / 'parallax.db'}")
    run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "single",
                                       "devices": ["cpu"], "epochs": 1, "tags": []}, status="completed")
    db.dispose_engines()
    profile_dir = target if where == "file" else target / "profile"
    result = cli("export", str(run_id), "--profile-dir", str(profile_dir), timeout=60)
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    expected = "is an existing file" if where == "file" else f"is inside {target}, which is a file"
    assert result.stderr.strip() == (f"error: --profile-dir {profile_dir} {expected}, not a folder: give a folder "
                                     "(it is created if missing)")
    assert target.read_text() == "keep me"


# --- cancel that cannot signal ------------------------------------------------------------------


def active_run(engine, pid: int) -> int:
    run_id = store.create_run(engine, {"dataset": "digits", "model": "test_resnet", "strategy": "single",
                                       "devices": ["cpu"], "epochs": 1, "tags": []}, status="running")
    store.set_process(engine, run_id, pid=pid, host=socket.gethostname())
    return run_id


@contextlib.contextmanager
def process_of_another_user():
    """A live process of uid 65534 (nobody) whose command line names trainer_backend as a run's
    does. Only root can start one: elsewhere this skips, and the PermissionError test below covers it."""
    if os.geteuid() != 0:
        pytest.skip("starting a process as another user needs root")
    reachable = subprocess.run(["setpriv", "--reuid=65533", "--regid=65533", "--clear-groups", sys.executable, "-c",
                                "import trainer_backend.control.lifecycle"], cwd=ROOT, capture_output=True, timeout=60)
    if reachable.returncode != 0:
        pytest.skip(f"an unprivileged user cannot run this checkout here: {reachable.stderr.decode()[-200:]}")
    process = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                                "import time; time.sleep(120)", "trainer_backend"], start_new_session=True)
    try:
        time.sleep(0.3)
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)


def test_cancelling_another_users_run_ends_with_a_message():
    # root may signal anyone, so the cancel itself runs as a third unprivileged user, on a home
    # both can reach (pytest's own temporary folders are root's alone).
    home = Path(tempfile.mkdtemp(prefix="parallax-other-user-"))
    try:
        home.chmod(0o777)
        url = f"sqlite:///{home / 'parallax.db'}"
        engine = db.make_engine(url)
        with process_of_another_user() as process:
            run_id = active_run(engine, process.pid)
            db.dispose_engines()
            (home / "parallax.db").chmod(0o666)
            env = {**os.environ, "PARALLAX_HOME": str(home), "HOME": str(home)}
            env.pop("PARALLAX_DB_URL", None)
            result = subprocess.run(["setpriv", "--reuid=65533", "--regid=65533", "--clear-groups", sys.executable,
                                     "-m", "trainer_backend", "cancel", str(run_id)],
                                    cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
            assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
            assert result.stderr.strip() == (
                f"error: run {run_id} is marked cancelled, but its process {process.pid} belongs to another user and "
                "cannot be signalled from here: it stops itself within 5 s if it still trains; otherwise ask its "
                "owner (or root) to end it")
            assert process.poll() is None  # not signalled: it was not ours to signal
        assert store.get_run(db.make_engine(url), run_id).status == "cancelled"
    finally:
        db.dispose_engines()
        shutil.rmtree(home, ignore_errors=True)


def test_a_refused_signal_is_a_message_not_a_permission_error(parallax_home, db_url, monkeypatch):
    """The os.kill edge as an unprivileged user meets it, wherever another uid cannot be had."""
    from trainer_backend.control import lifecycle
    engine = db.make_engine(db_url)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "trainer_backend"],
                          start_new_session=True) as process:
        try:
            run_id = active_run(engine, process.pid)

            def refuse(*args):
                raise PermissionError(1, "Operation not permitted")

            monkeypatch.setattr(lifecycle.os, "killpg", refuse)
            with pytest.raises(lifecycle.CancelNotDelivered, match=f"run {run_id} is marked cancelled"):
                lifecycle.cancel(run_id, db_url=db_url, grace_s=1)
            assert store.get_run(engine, run_id).status == "cancelled"
        finally:
            process.kill()
    db.dispose_engines()


def test_cancelling_a_run_whose_process_is_gone_or_reused_signals_nothing(cli, parallax_home):
    engine = db.make_engine(f"sqlite:///{parallax_home / 'parallax.db'}")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead_run = active_run(engine, gone.pid)
    # A pid the run recorded, now another program's: it must not be signalled.
    with subprocess.Popen(["sleep", "60"], start_new_session=True) as stranger:
        try:
            reused_run = active_run(engine, stranger.pid)
            # The run's own process started before (another boot, here): the pid has been reused since.
            store.set_measurements(engine, reused_run, {"process_start": "another-boot:1"})
            for run_id in (dead_run, reused_run):
                result = cli("cancel", str(run_id), timeout=60)
                assert result.returncode == 0 and result.stderr == "", result.stderr
                assert result.stdout.strip() == f"run_id={run_id} status=cancelled"
            assert stranger.poll() is None
        finally:
            stranger.kill()
    db.dispose_engines()


# --- Markdown and CSV ---------------------------------------------------------------------------

EVIL_TEXT = [
    "**bold** _it_ [click](https://evil.example) ![img](https://evil.example/x.png) <https://evil.example>",
    ":red[alarm] :material/home: :smile: $x^2$ `code` ~~gone~~ www.evil.example me@evil.example",
    "# heading", "- item", "1. first", "> quote",
]


@pytest.mark.parametrize("text", ["RuntimeError: boom", "Speedup of #3 ddp×2 test_resnet", "cancelled by the user",
                                  "lr 0.0 is not allowed: use a number in (0.0, 10.0]", "/data/my set/class_a"])
def test_ordinary_messages_are_left_as_they_are(text):
    assert escape_markdown(text) == text


@pytest.mark.parametrize("cell, safe", [
    ("=HYPERLINK(\"https://evil.example\")", "'=HYPERLINK(\"https://evil.example\")"),
    ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"), ("-2+3", "'-2+3"), ("@SUM(A1)", "'@SUM(A1)"),
    ("\tx", "'\tx"), ("-0.5", "-0.5"), ("+3", "+3"), ("1e-3", "1e-3"), ("resnet18", "resnet18"), (-0.5, -0.5),
])
def test_csv_cells_that_start_a_formula_get_a_quote_and_numbers_stay_numbers(cell, safe):
    assert csv_cell(cell) == safe


def test_csv_downloads_hold_no_formula():
    from reports import scaling
    from reports.profile import ops_csv

    runs = [{"id": 1, "strategy": "single", "model": "=1+1", "dataset": "@evil", "config": {"devices": ["cpu"]}}]
    epochs = scaling.epochs_frame([{"run_id": 1, "epoch": 1, "train_loss": -0.5, "train_acc": 0.5, "val_loss": 0.4,
                                    "val_acc": 0.6, "epoch_time_s": 1.0, "train_time_s": 1.0, "images_per_s": 10.0,
                                    "lr": 1e-3, "peak_memory_mb": {}, "extra": None}])
    table = pd.read_csv(io.StringIO(scaling.metrics_csv(runs, epochs)))
    assert table.loc[0, "model"] == "'=1+1" and table.loc[0, "dataset"] == "'@evil"
    assert table.loc[0, "train_loss"] == -0.5  # still a number
    ops = pd.DataFrame([{"rank": 0, "name": "-cmd|' /C calc'!A0", "self_cpu_us": -1.0}])
    assert pd.read_csv(io.BytesIO(ops_csv(ops))).loc[0].tolist() == [0, "'-cmd|' /C calc'!A0", -1.0]
    assert frame_for_csv(pd.DataFrame({"=bad": [1]})).columns.tolist() == ["'=bad"]


def test_user_text_on_the_run_page_is_shown_as_typed_in_a_real_browser(tmp_path):
    """Tags, note, dataset, model, engine notes and the error of a run, all Markdown, seen by chromium."""
    from playwright.sync_api import expect, sync_playwright
    from bench.browser import CHROMIUM, CHROMIUM_ARGS, start_dashboard

    home = tmp_path / "home"
    engine = db.make_engine(f"sqlite:///{home / 'parallax.db'}")
    run_id = store.create_run(engine, {"dataset": EVIL_TEXT[0], "model": "[m](https://evil.example)",
                                       "strategy": "single", "devices": ["cpu"], "epochs": 1,
                                       "tags": EVIL_TEXT[1:4]}, status="running", notes=EVIL_TEXT[4:])
    from db import dashboard

    dashboard.set_user_note(engine, run_id, EVIL_TEXT[1])
    store.set_status(engine, run_id, "failed", error=EVIL_TEXT[0])
    db.dispose_engines()
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("PARALLAX_DB_URL", None)
    server = start_dashboard(env, log=tmp_path / "streamlit.log",
                             extra_args=["--secrets.files", str(tmp_path / "no-secrets.toml")])
    try:
        url = server.url
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.goto(f"{url}/run?run={run_id}")
                expect(page.get_by_role("heading", name=f"Run #{run_id}")).to_be_visible(timeout=30_000)
                expect(page.get_by_test_id("stAlert").first).to_be_visible(timeout=30_000)
                page.wait_for_timeout(1000)
                main_area = page.get_by_test_id("stMain")
                shown = main_area.inner_text().replace("\u2060", "")
                for text in EVIL_TEXT:
                    assert text in shown, (text, shown)
                assert "[m](https://evil.example)" in shown
                # Nothing the user typed became a link, an image, emphasis, code, a heading, a list or LaTeX.
                injected = main_area.evaluate("""m => Array.from(m.querySelectorAll(
                    ':is(a, img, em, code, del, h1, h2, h3, ul, ol, blockquote, .katex)'))
                    .filter(e => !e.closest('[data-testid=stHeading]'))  // the page's own title
                    .map(e => e.outerHTML.slice(0, 120))""")
                assert injected == [], injected
                bold = main_area.evaluate("""m => Array.from(m.querySelectorAll('strong'))
                    .map(e => e.innerText.replace(/\u2060/g, ''))""")
                assert set(bold) == {"single", "[m](https://evil.example)"}, bold  # the page's own bold only
            finally:
                browser.close()
    finally:
        server.stop(grace_s=15)


def test_the_launch_forms_process_field_stops_at_the_limit(parallax_home):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S).run()
    at.radio(key="strategy").set_value("ddp").run()
    field = at.number_input(key="cpu_processes_ddp")
    assert (field.min, field.max) == (1, MOST_CPU)
    assert f"at most {MOST_CPU} on this machine" in field.help
    db.dispose_engines()

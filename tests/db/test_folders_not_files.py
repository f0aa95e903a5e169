"""Files in a run's folder that are not files: a named pipe, a device or a folder where the Run
page expects run.log or best.pt. The page reads only regular files and never blocks on opening
one (a pipe with no writer would hold the page's thread forever, one more on every refresh).

    .venv/bin/python -m pytest tests/db/test_folders_not_files.py -q
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

import pytest
from streamlit.testing.v1 import AppTest

from db.folders import NotARegularFile, open_regular_file, read_regular_file, run_folder
from tests.nvml_machines import fake_nvml  # noqa: F401
from tests.pages.test_every_page import APP, add_run, cpu_machine, texts  # noqa: F401
from ui.widgets import read_log_tail

PAGE_TIMEOUT_S = 60  # the first page in a process imports torch and timm
BLOCKED_AFTER_S = 30  # a page still not drawn by then waits on a pipe


def release(fifo) -> None:
    """Give a reader blocked on ``fifo`` its end of file, so a failing test leaves no thread behind."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@contextlib.contextmanager
def released_after(seconds: float, *fifos):
    """Past ``seconds``, keep releasing whatever waits on ``fifos``: a page that blocks on one then
    fails the test (slow, and without the warning) instead of hanging the suite."""
    done = threading.Event()

    def keep_releasing():
        if not done.wait(seconds):
            while not done.wait(0.2):
                for fifo in fifos:
                    release(fifo)

    watchdog = threading.Thread(target=keep_releasing, daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()
        watchdog.join()
        for fifo in fifos:
            release(fifo)


def test_a_named_pipe_as_run_log_and_checkpoint_does_not_hang_the_run_page(parallax_home, engine):
    run_id = add_run(engine)
    folder = run_folder(engine, run_id, create=True)
    os.mkfifo(folder / "run.log")
    os.mkfifo(folder / "best.pt")
    threads_before = threading.active_count()
    started = time.monotonic()
    with released_after(BLOCKED_AFTER_S, folder / "run.log", folder / "best.pt"):
        at = AppTest.from_file(APP, default_timeout=PAGE_TIMEOUT_S)
        at.query_params["run"] = str(run_id)
        at.switch_page("pages/run.py").run()
        at.run()  # a refresh: a second read of the same pipe
    assert time.monotonic() - started < BLOCKED_AFTER_S
    assert not at.exception, at.exception
    assert texts(at.title) == [f"Run #{run_id}"]
    assert any(f"{folder / 'run.log'} is a named pipe, not a regular file: it is not read" in w.replace("\\", "")
               for w in texts(at.warning)), texts(at.warning)
    assert not at.get("download_button")  # a pipe is not offered as the checkpoint
    assert threading.active_count() <= threads_before + 1  # no reader left waiting on the pipe


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_only_a_regular_file_is_opened_and_never_blocks(tmp_path, kind):
    path = tmp_path / "run.log"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")  # endless: a reader of it never reaches the end
    expected = {"fifo": "a named pipe", "device": "a character device", "folder": "a folder"}[kind]
    try:
        with pytest.raises(NotARegularFile, match=f"run.log is {expected}, not a regular file: it is not read"):
            read_log_tail(path)
        with pytest.raises(NotARegularFile):
            read_regular_file(path)
    finally:
        if kind == "fifo":
            release(path)


def test_a_regular_file_reads_as_before(tmp_path):
    path = tmp_path / "run.log"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    assert read_log_tail(path, lines=3) == "line 97\nline 98\nline 99"
    assert read_log_tail(tmp_path / "missing.log") is None
    with open_regular_file(path) as handle:
        assert handle.read(7) == b"line 0\n"

"""The model check judges a model file on its model: what its import prints (without a newline, or a forged
verdict at exit) does not change the verdict, and a helper process its import starts is ended with the check,
whether the check gave its verdict, reached its limit, or died on the way (killed, as the kernel's OOM killer
does).

    .venv/bin/python -m pytest tests/trainer_backend/supervisor/test_model_check.py -q
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import pytest

from contract.config import RunConfig
from contract.model_source import ModelError
from trainer_backend.supervisor.model_check import check_model_before_launch

pytestmark = pytest.mark.processes  # each check is a child process that imports torch

NET = '''
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, num_classes=10, in_chans=3):
        super().__init__()
        self.head = nn.Linear(in_chans, num_classes)

    def forward(self, x):
        return self.head(x.mean((2, 3)))
'''

NOISY = '''
import atexit
import sys

print("loading weights", end="")  # no newline: the last thing on stdout
sys.stdout.write('{"error": "model forged: refused"')
atexit.register(lambda: print('{"error": "forged at exit"}'))
''' + NET

HELPER = '''
import subprocess
import sys

if {away}:  # a daemon's double fork into a session of its own: its parent ends, it is nobody's child
    starter = subprocess.run([sys.executable, "-c", "import subprocess, sys; print(subprocess.Popen([sys.executable, "
                              "'-c', 'import time; time.sleep(600)'], start_new_session=True, "
                              "stdout=subprocess.DEVNULL).pid)"], stdout=subprocess.PIPE, text=True)
    pid = starter.stdout.strip()
else:
    pid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid
open({pid_file!r}, "w").write(str(pid))
''' + NET

HANGS = HELPER + '''
import time

time.sleep(600)  # the import never ends
'''


def config_for(path: Path) -> RunConfig:
    return RunConfig(model=f"{path}:Net", dataset="digits", image_size=16)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its parent is gone too
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_what_the_model_prints_does_not_change_its_verdict(tmp_path):
    path = tmp_path / "noisy.py"
    path.write_text(NOISY)
    assert check_model_before_launch(config_for(path)) == f"model {path}:Net takes num_classes and in_chans"


@pytest.mark.parametrize("away", [False, True], ids=["in-its-group", "in-a-session-of-its-own"])
def test_a_helper_process_the_import_starts_ends_with_the_check(tmp_path, away):
    pid_file = tmp_path / "helper.pid"
    path = tmp_path / "helper.py"
    path.write_text(HELPER.format(pid_file=str(pid_file), away=away))
    started = time.monotonic()
    assert "takes num_classes and in_chans" in check_model_before_launch(config_for(path), timeout_s=90)
    assert time.monotonic() - started < 80  # the helper holding the child's output does not hold the check
    assert not alive(int(pid_file.read_text()))


def test_a_check_that_hangs_ends_at_its_limit_with_every_process_it_started(tmp_path):
    pid_file = tmp_path / "helper.pid"
    path = tmp_path / "hangs.py"
    path.write_text(HANGS.format(pid_file=str(pid_file), away=True))
    with pytest.raises(ModelError, match="its check did not finish within 30 s"):
        check_model_before_launch(config_for(path), timeout_s=30)
    assert pid_file.exists(), "the import never started its helper: the limit is too short for this machine"
    assert not alive(int(pid_file.read_text()))


def test_a_child_that_ends_without_a_verdict_says_its_status_and_last_line(tmp_path):
    path = tmp_path / "exits.py"
    path.write_text("import os\nprint('about to leave')\nos._exit(3)\n" + NET)
    with pytest.raises(ModelError, match=r"ended without a verdict \(exit status 3\): about to leave"):
        check_model_before_launch(config_for(path))


def test_a_helper_outlives_no_check_that_dies_before_its_verdict(tmp_path):
    """The model's import starts a daemon in a session of its own, then its process is killed (as the OOM killer
    would): the helper is ended all the same, and the check says how its child ended."""
    pid_file = tmp_path / "helper.pid"
    path = tmp_path / "dies.py"
    path.write_text(HELPER.format(pid_file=str(pid_file), away=True)
                    + "\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    with pytest.raises(ModelError, match=r"ended without a verdict \(killed by SIGKILL\)"):
        check_model_before_launch(config_for(path), timeout_s=90)
    helper = int(pid_file.read_text())
    try:
        assert not alive(helper)
    finally:
        if alive(helper):
            os.kill(helper, 9)


CHATTY = """
import os, sys, time

line = "x" * 1023 + "\\n"
for _ in range(64 * 1024):  # 64 MB of prints, as a hung import logging in a loop would write without end
    sys.stdout.write(line)
sys.stdout.write("still loading\\n")
sys.stdout.flush()
time.sleep(2)
os._exit(5)
"""


def test_what_the_model_prints_takes_no_disk_however_much_it_prints(tmp_path, monkeypatch):
    """The check keeps only the end of the model's output (its last line is all it shows): a model that prints
    without end fills no disk while it runs, and the line is still there."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    path = tmp_path / "chatty.py"
    path.write_text(CHATTY + NET)
    peak, done = [0], threading.Event()

    def watch():
        while not done.wait(0.05):
            sizes = [entry.stat().st_size for entry in (tmp_path / "tmp").rglob("*") if entry.is_file()]
            peak[0] = max(peak[0], sum(sizes))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(ModelError, match=r"ended without a verdict \(exit status 5\): still loading$"):
            check_model_before_launch(config_for(path), timeout_s=90)
    finally:
        done.set()
        watcher.join()
    assert peak[0] < 1 << 20, f"the check held {peak[0]} bytes of the model's prints on disk"

"""Real scripts passing what training scripts pass: argparse's Namespace with a Path, an enum, a tuple, numpy and
torch values as the config; a step the database cannot hold among good ones; a name, config and metric from a
non-UTF-8 argument. Each run is recorded, with every good value, and finish does not wait out a lock window.

    .venv/bin/python -m pytest tests/parallax/test_script_run_values.py -q
"""

from __future__ import annotations

import json
import os

import pytest

import db
from db import script_metrics
from tests.parallax.scripts import run_script, write_script

pytestmark = pytest.mark.processes

ARGPARSE_CONFIG = """
    import argparse, enum, pathlib
    import numpy as np, torch
    import parallax

    class Optimizer(enum.Enum):
        ADAM = "adam"

    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=pathlib.Path, default=pathlib.Path("/data/cats"))
    args = parser.parse_args()
    args.optimizer, args.sizes, args.lr, args.scale = Optimizer.ADAM, (32, 64), np.float32(0.5), torch.tensor(2.0)
    run = parallax.init(project="tests", name="argparse", config=args, mode={mode!r})
    run.config.output = pathlib.Path("/out")  # a change after init, written by the background writer
    parallax.log({{"loss": 1.0}})
    parallax.finish()
    print("file", run.offline_file)
"""

STORED = {"data": "/data/cats", "optimizer": "Optimizer.ADAM", "sizes": [32, 64], "lr": 0.5, "scale": 2.0,
          "output": "/out"}

BAD_STEP = """
    import time
    import parallax

    run = parallax.init(project="tests", name="steps")
    parallax.log({"loss": 1.0}, step=1)
    for step in (2**63, -5, 2.5, float("nan")):
        try:
            parallax.log({"loss": 9.0}, step=step)
        except (TypeError, ValueError) as exc:
            print("refused:", exc)
    parallax.log({"loss": 3.0}, step=3)
    started = time.monotonic()
    parallax.finish()
    print(f"finish took {time.monotonic() - started:.1f} s")
    parallax.init(project="tests", name="uncaught")
    parallax.log({"loss": 1.0}, step=1)
    parallax.log({"loss": 2.0}, step=2**64)
"""

ARGUMENTS = """
    import sys
    import parallax

    word = sys.argv[1]
    run = parallax.init(project=word, name=word, config={"word": word, word: 1}, tags=[word], mode=sys.argv[2])
    parallax.log({word: 1.0})
    run.summary["note"] = word
    parallax.finish()
    print("file", run.offline_file)
"""


def test_a_config_from_argparse_with_any_values_is_stored_as_json_holds_it(engine, tmp_path):
    from trainer_backend.control.command import main

    script = write_script(tmp_path, "train.py", ARGPARSE_CONFIG.format(mode="online"))
    code, out, err = run_script([str(script)], cwd=tmp_path)
    assert code == 0, err
    run = db.get_run(engine, db.list_runs(engine)[0].id)
    assert run.status == "completed" and run.config == STORED
    offline = write_script(tmp_path, "offline.py", ARGPARSE_CONFIG.format(mode="offline"))
    code, out, err = run_script([str(offline)], cwd=tmp_path)
    assert code == 0, err
    path = out.split("file ", 1)[1].split()[0]
    assert json.loads(open(path, encoding="utf-8").readline())["config"] == {k: v for k, v in STORED.items()
                                                                               if k != "output"}
    assert main(["sync", path]) == 0
    synced = db.get_run(engine, max(r.id for r in db.list_runs(engine)))
    assert synced.config == STORED


def test_a_step_the_database_cannot_hold_is_refused_at_log_and_loses_nothing_else(engine, tmp_path):
    script = write_script(tmp_path, "train.py", BAD_STEP)
    code, out, err = run_script([str(script)], cwd=tmp_path, env_extra={"PARALLAX_DB_LOCK_WAIT_S": "30"})
    assert code == 1  # the second run's uncaught refusal ends the script
    assert out.count("refused:") == 4 and "step=9223372036854775808 is larger than the database holds" in out
    assert float(out.split("finish took ")[1].split()[0]) < 10  # no lock window waited out for a bad value
    assert "not written" not in err
    first, second = sorted(db.list_runs(engine), key=lambda r: r.id)
    points = script_metrics.read_points(engine, [first.id], max_points=None)
    assert [(p["step"], p["value"]) for p in points] == [(1, 1.0), (3, 3.0)]
    assert db.get_run(engine, first.id).status == "completed"
    second = db.get_run(engine, second.id)
    assert second.status == "failed" and "step=18446744073709551616 is larger than the database holds" in second.error
    assert [p["step"] for p in script_metrics.read_points(engine, [second.id], max_points=None)] == [1]


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_names_and_config_from_a_non_utf8_argument_are_stored_escaped(engine, tmp_path, mode):
    from trainer_backend.control.command import main

    script = write_script(tmp_path, "train.py", ARGUMENTS)
    word = os.fsdecode(b"caf\xe9")  # what Python makes of a Latin-1 argument: a lone surrogate
    code, out, err = run_script([str(script), word, mode], cwd=tmp_path)
    assert code == 0, err
    if mode == "offline":
        assert main(["sync", out.split("file ", 1)[1].split()[0]]) == 0
    run = db.get_run(engine, db.list_runs(engine)[0].id)
    assert run.status == "completed" and run.tags == ["caf\\xe9"]
    assert run.config == {"word": "caf\\xe9", "caf\\xe9": 1}
    assert run.measurements["script"]["name"] == "caf\\xe9" and run.measurements["summary"]["note"] == "caf\\xe9"
    assert [p["name"] for p in script_metrics.read_points(engine, [run.id], max_points=None)] == ["caf\\xe9"]

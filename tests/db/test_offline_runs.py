"""``parallax sync`` imports a file once, whole or not at all: every line is checked before anything is written
(a fault names the file's line, in one line), a failed attempt leaves nothing so the corrected file syncs, and
two syncs of one file at once import it once. On SQLite and PostgreSQL.

    .venv/bin/python -m pytest tests/db/test_offline_runs.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import db
from db import script_metrics
from db.offline_runs import OfflineFileError, sync_offline_file
from tests.support import ROOT

HEADER = {"parallax_offline": 1, "key": "6f8091bb517a4b828ba8d3c153beaf59", "project": "p", "name": "offline",
          "config": {"lr": 0.1}, "tags": ["t"], "created_at": "2026-12-07T10:00:00+00:00", "host": "h", "pid": 1,
          "world_size": 1, "file": "/x/train.py"}
END = {"end": "completed", "error": None, "finished_at": "2026-12-07T11:00:00+00:00", "summary": {"loss": 0.5}}


@pytest.fixture
def _close_engines():
    yield
    db.dispose_engines()


@pytest.fixture
def db_url(backend_db_url):
    return backend_db_url


@pytest.fixture
def engine(db_url, _close_engines):
    return db.make_engine(db_url)


@pytest.fixture(scope="module")
def sqlite_engine(tmp_path_factory):
    """One database for the files refused before it is asked (each case checks it stays empty)."""
    engine = db.make_engine(f"sqlite:///{tmp_path_factory.mktemp('refused') / 'parallax.db'}")
    yield engine
    db.dispose_engines()


def test_a_value_that_fails_in_the_database_leaves_no_run_and_the_fixed_file_syncs(engine, tmp_path):
    """A step past what the database holds, written by an older SDK: checked first now; and were the database
    to refuse a row, the transaction leaves nothing (the run is not left running with no values)."""
    records = good_records()
    records[2] = {**value_line(1), "step": 2**63}
    path = write(tmp_path / "run.jsonl", records)
    with pytest.raises(OfflineFileError, match=":3: step 9223372036854775808"):
        sync_offline_file(path, engine)
    assert db.list_runs(engine) == []
    write(path, good_records())
    assert db.get_run(engine, sync_offline_file(path, engine)).status == "completed"


def value_line(step: int, value=1.0) -> dict:
    return {"step": step, "t": 1796637600.0 + step, "values": {"loss": value}}


def write(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def good_records(steps: int = 5) -> list:
    return [HEADER, *(value_line(step) for step in range(steps)), {"config": {"lr": 0.2}}, END]


def test_a_good_file_is_one_completed_run_with_every_value_and_its_own_end_time(engine, tmp_path):
    run_id = sync_offline_file(write(tmp_path / "run.jsonl", good_records()), engine)
    run = db.get_run(engine, run_id)
    assert (run.status, run.config, run.tags) == ("completed", {"lr": 0.2}, ["t"])
    assert run.finished_at.isoformat().startswith("2026-12-07T11:00:00")
    assert run.measurements["summary"] == {"loss": 0.5}
    assert [p["step"] for p in script_metrics.read_points(engine, [run_id], max_points=None)] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("change, line, words", [
    (lambda r: r.__setitem__(0, [1, 2]), None, "its first line is a JSON list"),
    (lambda r: r.__setitem__(0, '"just text"'), None, "its first line is a JSON text"),
    (lambda r: r.__setitem__(0, {"project": "p"}), None, "its first line is an object without parallax_offline"),
    (lambda r: r.__setitem__(0, {**HEADER, "parallax_offline": 9}), 1, "is offline format 9"),
    (lambda r: r.__setitem__(0, {k: v for k, v in HEADER.items() if k != "key"}), 1, "key must be a text, not missing"),
    (lambda r: r.__setitem__(0, {**HEADER, "key": 5}), 1, "key must be a text, not number"),
    (lambda r: r.__setitem__(0, {**HEADER, "created_at": "yesterday"}), 1, 'created_at "yesterday" is not an ISO date'),
    (lambda r: r.__setitem__(0, {**HEADER, "tags": "a,b"}), 1, "tags must be a list of texts"),
    (lambda r: r.__setitem__(0, {**HEADER, "world_size": "2"}), 1, "world_size must be a whole number"),
    (lambda r: r.__setitem__(0, {**HEADER, "config": [1]}), 1, "config must be a JSON object, not a list"),
    (lambda r: r.__setitem__(2, value_line(1, "high")), 3, '"loss" is "high", not a number'),
    (lambda r: r.__setitem__(2, value_line(1, True)), 3, '"loss" is true, not a number'),
    (lambda r: r.__setitem__(2, {**value_line(1), "step": -1}), 3, "step -1 is not a whole number from 0"),
    (lambda r: r.__setitem__(2, {**value_line(1), "step": 2**63}), 3, "step 9223372036854775808 is not a whole number"),
    (lambda r: r.__setitem__(2, {**value_line(1), "step": 1.5}), 3, "step 1.5 is not a whole number"),
    (lambda r: r.__setitem__(2, {**value_line(1), "t": "noon"}), 3, 't "noon" is not a time in seconds'),
    (lambda r: r.__setitem__(2, {**value_line(1), "values": [1.0]}), 3, "values must be an object"),
    (lambda r: r.__setitem__(2, "{not json"), 3, "is not a JSON line"),
    (lambda r: r.__setitem__(2, [1]), 3, "is a JSON list, not an object"),
    (lambda r: r.__setitem__(2, {"foo": 1}), 3, "holds none of values, config or end"),
    (lambda r: r.__setitem__(-2, {"config": "lr=1"}), 7, "config must be a JSON object, not a text"),
    (lambda r: r.__setitem__(-1, {**END, "end": "exploded"}), 8, 'end "exploded" is not one of'),
    (lambda r: r.__setitem__(-1, {**END, "error": 5}), 8, "error must be a text or null"),
    (lambda r: r.__setitem__(-1, {**END, "summary": [1]}), 8, "summary must be a JSON object"),
    (lambda r: r.insert(-2, END), 8, "comes after the line that says how the run ended (line 7)"),
    # values JSON holds and Python reads, but no float or date the database stores
    (lambda r: r.__setitem__(2, value_line(1, 10**400)), 3, '"loss" is 1000000000'),
    (lambda r: r.__setitem__(2, {**value_line(1), "t": 10**400}), 3, "t 1000000000"),
    (lambda r: r.__setitem__(-1, {**END, "end": ["completed"]}), 8, 'end ["completed"] is not one of'),
    (lambda r: r.__setitem__(-1, {**END, "end": {"status": "completed"}}), 8, 'end {"status": "completed"} is not'),
    (lambda r: r.__setitem__(0, {**HEADER, "created_at": "0001-01-01T00:00:00+05:00"}), 1,
     'created_at "0001-01-01T00:00:00+05:00" is not a date and time in UTC\'s range'),
    (lambda r: r.__setitem__(-1, {**END, "finished_at": "9999-12-31T23:59:59-05:00"}), 8,
     'finished_at "9999-12-31T23:59:59-05:00" is not a date and time in UTC\'s range'),
])
def test_a_bad_file_is_refused_naming_its_line_and_writes_nothing(sqlite_engine, tmp_path, change, line, words):
    engine = sqlite_engine  # the file is checked before the database is asked: one backend shows it
    records = good_records()
    change(records)
    path = write(tmp_path / "run.jsonl", records)
    with pytest.raises(OfflineFileError) as refused:
        sync_offline_file(path, engine)
    text = str(refused.value)
    assert words in text and "\n" not in text, text
    assert text.startswith(f"{path}:{line}" if line else f"{path} is not a Parallax offline run file"), text
    assert db.list_runs(engine) == []  # (the corrected file then syncs: test_a_value_that_fails_in_the_database_…)


def test_a_file_that_is_not_utf8_names_its_line(sqlite_engine, tmp_path):
    engine = sqlite_engine
    path = write(tmp_path / "run.jsonl", good_records())
    path.write_bytes(path.read_bytes().replace(b'"loss"', b'"l\xe9ss"', 2))
    with pytest.raises(OfflineFileError, match=r"run.jsonl:2 is not UTF-8 text"):
        sync_offline_file(path, engine)
    assert db.list_runs(engine) == []


def test_a_last_line_cut_short_is_left_out_and_a_file_without_an_end_is_lost(engine, tmp_path):
    records = [HEADER, value_line(0), value_line(1), '{"step": 2, "t": 17966']
    run = db.get_run(engine, sync_offline_file(write(tmp_path / "run.jsonl", records), engine))
    assert run.status == "lost" and "ends without saying how the run ended" in run.error
    assert [p["step"] for p in script_metrics.read_points(engine, [run.id], max_points=None)] == [0, 1]


def test_escaped_odd_bytes_and_non_numbers_in_the_file_are_stored_as_the_database_holds_them(engine, tmp_path):
    header = {**HEADER, "name": "caf\udce9", "config": {"x": float("nan"), "caf\udce9": "a\x00b"}}
    records = [header, value_line(0), value_line(1, float("nan")), value_line(2, float("inf")), END]
    run = db.get_run(engine, sync_offline_file(write(tmp_path / "run.jsonl", records), engine))
    assert run.measurements["script"]["name"] == "caf\\xe9"
    assert run.config == {"x": "nan", "caf\\xe9": "a\\x00b"}
    points = script_metrics.read_points(engine, [run.id], max_points=None)
    assert [(p["step"], p["value"]) for p in points] == [(0, 1.0), (1, None), (2, None)]  # gaps, as online


def test_a_config_nested_too_deeply_is_one_line(sqlite_engine, tmp_path):
    deep = "1"
    for _ in range(990):
        deep = '{"a": ' + deep + "}"
    path = write(tmp_path / "run.jsonl", [HEADER, '{"config": ' + deep + "}", END])
    with pytest.raises(OfflineFileError, match=r"run.jsonl:2(: config nests its values too deeply| is not a JSON line)"):
        sync_offline_file(path, sqlite_engine)


def test_a_file_synced_before_is_refused_naming_its_run(engine, tmp_path):
    path = write(tmp_path / "run.jsonl", good_records())
    run_id = sync_offline_file(path, engine)
    with pytest.raises(OfflineFileError, match=f"was synced before, as run {run_id}"):
        sync_offline_file(path, engine)


@pytest.mark.processes
def test_two_syncs_of_one_file_at_once_import_it_once(engine, db_url, tmp_path):
    path = write(tmp_path / "run.jsonl", [HEADER, *(value_line(step) for step in range(20_000)), END])
    env = {**os.environ, "PARALLAX_DB_URL": db_url,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    both = [subprocess.Popen([sys.executable, "-m", "trainer_backend.control.command", "sync", str(path)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    said = [process.communicate(timeout=300) for process in both]
    assert sorted(process.returncode for process in both) == [0, 1], said
    assert any("was synced before" in err for _, err in said), said
    assert not any("Traceback" in err for _, err in said), said
    (run,) = db.list_runs(engine)
    assert len(script_metrics.read_points(engine, [run.id], max_points=None)) == 20_000


@pytest.mark.processes
def test_the_command_line_says_one_line_for_a_header_of_the_wrong_type(parallax_home, tmp_path):
    path = write(tmp_path / "run.jsonl", [[1, 2], value_line(0)])
    done = subprocess.run([sys.executable, "-m", "trainer_backend.control.command", "sync", str(path)], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"error: {path}: {path} is not a Parallax offline run file: its first line is a "
                                   'JSON list (its first line should start {"parallax_offline": 1, ...})')

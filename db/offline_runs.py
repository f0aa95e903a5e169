"""``parallax sync FILE``: an offline script run's file (parallax/offline.py writes it, one JSON object a
line) put in the database as a script run, once, whole or not at all.

    run_id = sync_offline_file("parallax-train-20261128T120000-4242.jsonl", engine)

The file is read and checked whole before anything is written: each line a JSON object of a kind the SDK
writes, each field of the type it must have, every step one the database holds; a fault is one ValueError
naming the file, the line and what is wrong. A last line cut short (the script was killed as it wrote) is left
out, as are the values it would have held. Then the run, its values and how it ended go in as one transaction,
under a lock on the file's identity (the key in its first line): two syncs of one file at once import it once
(the other is told it was synced), and an attempt that fails leaves nothing, so the corrected file syncs.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from contract.printable import one_line, storable_text
from contract.storage import MAX_LOGGED_STEP, OFFLINE_FORMAT_VERSION
from db import script_metrics
from db.connection import retry_when_locked, session_scope
from db.notify import notify
from db.run_state import TERMINAL_STATUSES
from db.tables import Run, utcnow

INSERT_CHUNK = 50_000  # points packed per statement: a file of millions of values is never held twice
LOST = ("the offline run file ends without saying how the run ended: the script was killed, or it is still "
        "running")


@dataclass
class OfflineRun:
    """What a checked file holds, as the database will store it."""

    key: str
    project: str
    name: str
    created_at: datetime
    tags: list[str]
    world_size: int
    script: dict[str, Any]
    config: dict[str, Any]
    points: list[tuple] = field(default_factory=list)  # (name, step, t_s, value)
    end: str = "lost"
    error: str | None = LOST
    finished_at: datetime | None = None
    summary: dict[str, Any] = field(default_factory=dict)


class OfflineFileError(ValueError):
    """The file is not one ``sync`` can import: the message names the file, the line and what is wrong."""


def sync_offline_file(path: str | Path, engine) -> int:
    """Put the offline run in ``path`` into the database; returns its run id. A file synced before is
    refused (its run is named), as is a file that is not an offline run, naming the line at fault."""
    path = Path(path)
    run = read_offline_file(path)
    key = f"script:offline:{run.key}"
    run_id = retry_when_locked(lambda: _import(path, run, key, engine), what=f"sync {path}")
    notify(engine, run_id, f"run.{run.end}", run.error)  # after the commit, as a run that ends here is told
    return run_id


def _import(path: Path, run: OfflineRun, key: str, engine) -> int:
    with session_scope(engine) as session:
        _lock_identity(session, key)
        found = session.scalar(select(Run.id).where(Run.elastic_run_id == key, Run.kind == script_metrics.SCRIPT_KIND)
                               .order_by(Run.id).limit(1))
        if found is not None:
            raise OfflineFileError(f"{path} was synced before, as run {found}; delete that run to sync it again")
        row = script_metrics.script_run_row(
            name=run.name, project=run.project, config=run.config, key=key, tags=run.tags, world_size=run.world_size,
            created_at=run.created_at, status=run.end,
            script={**run.script, "offline_file": storable_text(str(path.resolve()))})
        row.finished_at = run.finished_at or utcnow()
        row.error = run.error
        row.measurements = {**row.measurements, "summary": run.summary}
        session.add(row)
        session.flush()
        connection, series_ids = session.connection(), {}
        for start in range(0, len(run.points), INSERT_CHUNK):
            columns: dict[str, tuple[list, list, list]] = {}
            for name, step, t_s, value in run.points[start:start + INSERT_CHUNK]:
                column = columns.setdefault(name, ([], [], []))
                column[0].append(step)
                column[1].append(t_s)
                column[2].append(value)
            script_metrics.add_columns_on(connection, row.id, columns, series_ids)
        script_metrics.keep_script_figures(connection, row.id)  # the Runs page's columns, as for a run logged online
        return row.id


def _lock_identity(session, key: str) -> None:
    """Hold, until the transaction ends, a lock that a second sync of the same file waits for. PostgreSQL: an
    advisory lock on the key's hash (other syncs and runs go on); SQLite: the database's write lock, taken
    before the key is looked up (SQLite has one writer at a time in any case)."""
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        lock = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)
        session.execute(select(func.pg_advisory_xact_lock(lock)))
    elif connection.dialect.name == "sqlite":
        connection.exec_driver_sql("BEGIN IMMEDIATE")


# --- reading and checking the file ------------------------------------------------------------


def read_offline_file(path: Path) -> OfflineRun:
    """The run in ``path``, every line checked; OfflineFileError naming the line at fault."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise OfflineFileError(f"{path} cannot be read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise OfflineFileError(f"{path}:{line} is not UTF-8 text (byte {exc.start}); an offline run file is "
                               "JSON lines as parallax writes them") from None
    lines = text.split("\n")
    run = _header(path, lines[0])
    last = max((number for number, line in enumerate(lines, start=1) if line.strip()), default=1)
    ended_at = None
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            if number == last:  # the last line cut short by a kill: the lines before it stand
                break
            raise OfflineFileError(f"{path}:{number} is not a JSON line") from None
        where = f"{path}:{number}"
        if ended_at is not None:
            raise OfflineFileError(f"{where} comes after the line that says how the run ended (line {ended_at})")
        if not isinstance(record, dict):
            raise OfflineFileError(f"{where} is a JSON {_kind(record)}, not an object (values, config or end)")
        if "values" in record:
            run.points += _points(where, record, run.created_at.timestamp())
        elif "config" in record:
            run.config = _object(where, record, "config")
        elif "end" in record:
            _end(where, record, run)
            ended_at = number
        else:
            raise OfflineFileError(f"{where} is not a line of an offline run: it holds none of values, config or end")
    return run


def _header(path: Path, line: str) -> OfflineRun:
    expected = f'its first line should start {{"parallax_offline": {OFFLINE_FORMAT_VERSION}, ...}}'
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):
        raise OfflineFileError(f"{path} is not a Parallax offline run file ({expected})") from None
    if not isinstance(header, dict) or "parallax_offline" not in header:
        what = f"a JSON {_kind(header)}" if not isinstance(header, dict) else "an object without parallax_offline"
        raise OfflineFileError(f"{path} is not a Parallax offline run file: its first line is {what} ({expected})")
    if header["parallax_offline"] != OFFLINE_FORMAT_VERSION:
        raise OfflineFileError(f"{path}:1 is offline format {_shown(header['parallax_offline'])}; this "
                               f"Parallax reads format {OFFLINE_FORMAT_VERSION}")
    where = f"{path}:1"
    key = _text(where, header, "key", required=True)
    if not key.strip() or len(key) > 200:
        raise OfflineFileError(f"{where}: key must be a text of 1 to 200 characters")
    created_at = _moment(where, "created_at", _text(where, header, "created_at", required=True))
    tags = header.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise OfflineFileError(f"{where}: tags must be a list of texts, not {_shown(tags)}")
    world_size = header.get("world_size", 1)
    if type(world_size) is not int or not 1 <= world_size <= 1_000_000:
        raise OfflineFileError(f"{where}: world_size must be a whole number of processes from 1, not "
                               f"{_shown(world_size)}")
    return OfflineRun(
        key=storable_text(key), project=storable_text(_text(where, header, "project")),
        name=storable_text(_text(where, header, "name")), created_at=created_at,
        tags=[storable_text(tag) for tag in tags], world_size=world_size, config=_object(where, header, "config"),
        script={"file": storable_text(_text(where, header, "file")), "host": storable_text(_text(where, header, "host"))})


def _points(where: str, record: dict, started_s: float) -> list[tuple]:
    step, at, values = record.get("step"), record.get("t"), record.get("values")
    if type(step) is not int or not 0 <= step <= MAX_LOGGED_STEP:
        raise OfflineFileError(f"{where}: step {_shown(step)} is not a whole number from 0 to "
                               f"{MAX_LOGGED_STEP}")
    if type(at) not in (int, float) or _as_float(at) is None:
        raise OfflineFileError(f"{where}: t {_shown(at)} is not a time in seconds")
    if not isinstance(values, dict):
        raise OfflineFileError(f"{where}: values must be an object of {{name: number}}, not a {_kind(values)}")
    points = []
    for name, value in values.items():
        if value is not None and type(value) not in (int, float):
            raise OfflineFileError(f"{where}: {_shown(name)} is {_shown(value)}, not a number")
        if type(value) is int and _as_float(value) is None:  # as parallax.log refuses it
            raise OfflineFileError(f"{where}: {_shown(name)} is {_shown(value)}, larger than a float holds "
                                   "(about 1.8e308)")
        # NaN and infinities (a hand-written NaN; the SDK writes null, read as NaN) are kept and marked on the
        # chart, as when logged online
        points.append((storable_text(name), step, round(at - started_s, 3), value))
    return points


def _end(where: str, record: dict, run: OfflineRun) -> None:
    if not isinstance(record["end"], str) or record["end"] not in TERMINAL_STATUSES:
        raise OfflineFileError(f"{where}: end {_shown(record['end'])} is not one of "
                               f"{', '.join(sorted(TERMINAL_STATUSES))}")
    error = record.get("error")
    if error is not None and not isinstance(error, str):
        raise OfflineFileError(f"{where}: error must be a text or null, not a {_kind(error)}")
    finished = record.get("finished_at")
    run.finished_at = _moment(where, "finished_at", finished) if isinstance(finished, str) else None
    run.end, run.error = record["end"], None if error is None else storable_text(error)
    run.summary = _object(where, record, "summary")


def _object(where: str, record: dict, name: str) -> dict:
    value = record.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise OfflineFileError(f"{where}: {name} must be a JSON object, not a {_kind(value)}")
    try:
        return _storable(value)
    except RecursionError:
        raise OfflineFileError(f"{where}: {name} nests its values too deeply to store") from None


def _storable(value):
    """A JSON value from the file with every text the database can hold (escapes read back as surrogates)."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_text(key): _storable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_storable(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # NaN and Infinity, which Python's json reads: no database JSON holds them
    return value


def _text(where: str, record: dict, name: str, *, required: bool = False) -> str:
    value = record.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise OfflineFileError(f"{where}: {name} must be a text, not {'missing' if value is None else _kind(value)}")
    return value


def _moment(where: str, name: str, text: str) -> datetime:
    """``text`` (ISO 8601; UTC where it names no zone) as a moment in UTC, which is how the database stores it."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise OfflineFileError(f"{where}: {name} {_shown(text)} is not an ISO date and time") from None
    try:
        return moment.astimezone(timezone.utc) if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
    except OverflowError:  # year 1 east of Greenwich, year 9999 west of it
        raise OfflineFileError(f"{where}: {name} {_shown(text)} is not a date and time in UTC's range (years 1 "
                               "to 9999)") from None


def _as_float(number: int | float) -> float | None:
    """``number`` as a finite float, None where it is none (too large for a float, NaN, an infinity)."""
    try:
        value = float(number)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _shown(value) -> str:
    """A value from the file as JSON writes it (a text in quotes), on one line, cut to 60 characters."""
    text = one_line(json.dumps(value, ensure_ascii=False))
    return text if len(text) <= 60 else text[:59] + "…"


def _kind(value) -> str:
    return {dict: "object", list: "list", str: "text", bool: "true/false", type(None): "null"}.get(
        type(value), "number" if isinstance(value, (int, float)) else type(value).__name__)

"""``parallax sync FILE``: an offline script run's file (parallax/offline.py writes it, one JSON object a
line) put in the database as a script run, once.

    run_id = sync_offline_file("parallax-train-20261128T120000-4242.jsonl", engine)
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from contract.storage import OFFLINE_FORMAT_VERSION
from db import run_state, script_metrics, store


def sync_offline_file(path: str | Path, engine) -> int:
    """Put the offline run in ``path`` into the database; returns its run id. A file synced before is
    refused (its run is named), as is a file that is not an offline run."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        header = json.loads(lines[0]) if lines else {}
    except json.JSONDecodeError:
        header = {}
    if header.get("parallax_offline") != OFFLINE_FORMAT_VERSION:
        raise ValueError(f"{path} is not a Parallax offline run file (its first line should start "
                         f'{{"parallax_offline": {OFFLINE_FORMAT_VERSION}, ...}})')
    key = f"script:offline:{header['key']}"
    if (found := script_metrics.find_script_run(engine, key)) is not None:
        raise ValueError(f"{path} was synced before, as run {found['id']}; delete that run to sync it again")
    created_at = datetime.fromisoformat(header["created_at"])
    points, config, end = [], dict(header.get("config") or {}), None
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # the last line cut short by a kill: the points before it stand
                break
            raise ValueError(f"{path}:{number} is not a JSON line") from None
        if "values" in record:
            points += [(name, record["step"], round(record["t"] - created_at.timestamp(), 3), value)
                       for name, value in record["values"].items()]
        elif "config" in record:
            config = record["config"]
        elif "end" in record:
            end = record
    run_id = script_metrics.create_script_run(
        engine, name=header["name"], project=header["project"], config=config, key=key, tags=header.get("tags") or [],
        world_size=header.get("world_size") or 1, created_at=created_at,
        script={"file": header.get("file", ""), "offline_file": str(path.resolve()), "host": header.get("host")})
    for start in range(0, len(points), 50_000):
        script_metrics.add_points(engine, run_id, points[start:start + 50_000])
    if end is not None:
        store.set_measurements(engine, run_id, {"summary": end.get("summary") or {}})
        run_state.finish(engine, run_id, end["end"], end.get("error"))
    else:
        run_state.finish(engine, run_id, "lost", "the offline run file ends without saying how the run ended: the "
                         "script was killed, or it is still running")
    return run_id

"""Offline runs: ``mode="offline"`` writes the run to a file of JSON lines beside the script, and
``parallax sync FILE`` puts it in the database as a script run, once (db/offline_runs.py).

The file, one JSON object a line:

    {"parallax_offline": 1, "key": "...", "project": ..., "name": ..., "config": {...}, "tags": [...],
     "created_at": "<ISO UTC>", "host": ..., "pid": ..., "world_size": 1, "file": "<script>"}
    {"step": 0, "t": <unix time>, "values": {"train/loss": 2.3}}      one per log call
    {"config": {...}}                                                  the script changed run.config
    {"end": "completed", "error": null, "finished_at": "<ISO UTC>", "summary": {...}}

A file without its end line (the script was killed, or still runs) is synced as lost.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path

from contract.storage import OFFLINE_FORMAT_VERSION as FORMAT_VERSION
from parallax.values import as_config, storable_text


class FileSink:
    """The writer's sink for an offline run: appends lines, flushed at each turn."""

    def __init__(self, path: Path, run):
        self.path, self.run = path, run
        header = {"parallax_offline": FORMAT_VERSION, "key": uuid.uuid4().hex, "project": run.project,
                  "name": run.name, "config": as_config(run.config), "tags": run.tags,
                  "created_at": datetime.now(timezone.utc).isoformat(), "host": socket.gethostname(),
                  "pid": os.getpid(), "world_size": run.info.world_size,
                  "file": storable_text(os.path.abspath(sys.argv[0])) if sys.argv and sys.argv[0] else ""}
        run.config.take_change()
        with open(path, "x", encoding="utf-8") as out:
            out.write(json.dumps(header) + "\n")

    @classmethod
    def beside_script(cls, run) -> FileSink:
        script = Path(sys.argv[0]) if sys.argv and sys.argv[0] and Path(sys.argv[0]).is_file() else None
        folder = script.resolve().parent if script is not None else Path.cwd()
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        stem = script.stem if script is not None else "script"
        return cls(folder / f"parallax-{stem}-{stamp}-{os.getpid()}.jsonl", run)

    def write(self, entries: list[tuple]) -> None:
        lines = "".join(json.dumps({"step": step, "t": at, "values": {k: _finite(v) for k, v in values.items()}})
                        + "\n" for step, at, values in entries)
        self._append(lines)

    def tick(self) -> None:
        if (config := self.run.config.take_change()) is not None:
            self._append(json.dumps({"config": config}) + "\n")  # take_change gives it as JSON holds it

    def finish(self, status: str, error: str | None) -> None:
        """The last lines: a changed config, and how the run ended."""
        self.tick()
        summary = as_config({k: v for k, v in self.run.summary.items() if isinstance(v, (str, int, bool)) or
                             (isinstance(v, float) and math.isfinite(v))})
        self._append(json.dumps({"end": status, "error": error, "finished_at": datetime.now(timezone.utc).isoformat(),
                                 "summary": summary}) + "\n")

    def _append(self, text: str) -> None:
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(text)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None

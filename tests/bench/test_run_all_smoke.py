"""The benchmark scripts still run: each process of ``make bench`` with --quick (tiny settings, one
repeat), two at a time; the four benchmarks that share Parallax's runs run as one process there.

This checks the scripts, not the figures: ``make bench`` measures. Each script must exit 0 and
leave its entry in the results file, with figures or a reason it skipped (e.g. Lightning not
installed, which ``make bench`` installs and ``make test`` does not).

It checks the benchmarks, not Parallax, and takes several minutes of both cores (each process bounded at 15
minutes, for a busy runner), so it has a
target of its own, ``make bench-check``, which CI runs after ``make test``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.run_all import BENCHMARKS, units  # noqa: E402


MAY_SKIP = {"gpu", "lightning_compare"}

pytestmark = pytest.mark.bench


def run_quick(index: int, label: str, arguments: list[str], tmp_path: Path) -> tuple[str, subprocess.CompletedProcess,
                                                                                   float]:
    # Each process writes to its own file, so that two running at once never race on one.
    env = {**os.environ, "PARALLAX_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    env.pop("PARALLAX_DB_URL", None)
    started = time.perf_counter()
    results = tmp_path / f"results-{index}.json"
    done = subprocess.run([sys.executable, *arguments, "--quick", "--results", str(results)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return label, done, time.perf_counter() - started


@pytest.mark.timeout(1800)
def test_every_benchmark_runs_quick(tmp_path):
    # Two at a time: most of a quick run is single-threaded interpreter start and imports.
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(lambda unit: run_quick(unit[0], *unit[1], tmp_path),
                                 enumerate(units(list(BENCHMARKS)))))
    entries = {}
    for index, (label, done, seconds) in enumerate(outcomes):
        assert done.returncode == 0, f"{label} --quick failed in {seconds:.0f} s:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        entries.update(json.loads((tmp_path / f"results-{index}.json").read_text())["benchmarks"])
    assert sorted(entries) == sorted(BENCHMARKS)
    for name, entry in entries.items():
        assert entry["quick"] is True
        # Only what cannot exist under make test may skip: a GPU, and Lightning (make bench installs it).
        assert entry["rows"] or (entry["skipped"] and name in MAY_SKIP), \
            f"bench/{name}.py recorded no figures: {entry['skipped'] or 'no rows'}"
        for row in entry["rows"]:
            assert row["n"] == len(row["values"]) >= 1

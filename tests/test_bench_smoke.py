"""The benchmark scripts still run: each with --quick (tiny settings, one repeat), two at a time.

This checks the scripts, not the figures: ``make bench`` measures. Each script must exit 0 and
leave its entry in the results file, with figures or a reason it skipped (e.g. Lightning not
installed, which ``make bench`` installs and ``make test`` does not).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run_all import BENCHMARKS  # noqa: E402


def run_quick(name: str, results_dir: Path, home: Path) -> tuple[str, subprocess.CompletedProcess, float]:
    # Each script writes to its own file, so that two running at once never race on one.
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("PARALLAX_DB_URL", None)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{name}.py"), "--quick", "--results", str(results_dir / f"{name}.json")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    return name, done, time.perf_counter() - started


@pytest.mark.timeout(400)
def test_every_benchmark_runs_quick(tmp_path):
    # Two at a time: most of a quick run is single-threaded interpreter start and imports.
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(lambda name: run_quick(name, tmp_path, tmp_path / "home"), BENCHMARKS))
    for name, done, seconds in outcomes:
        assert done.returncode == 0, f"bench/{name}.py --quick failed in {seconds:.0f} s:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        entry = json.loads((tmp_path / f"{name}.json").read_text())["benchmarks"][name]
        assert entry["quick"] is True
        assert entry["skipped"] or entry["rows"], f"bench/{name}.py recorded no figures"
        for row in entry["rows"]:
            assert row["n"] == len(row["values"]) >= 1

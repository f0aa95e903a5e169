"""Soak: three runs training at once while a real browser keeps the Run and Runs pages open and
refreshing, for a set time; then what broke, if anything.

For ``--minutes`` (default 10) this keeps three CPU runs going side by side (``PARALLAX_CPU_RUNS=3``;
a run that ends is replaced by a new one like it): ``single`` test_resnet, ``ddp`` test_resnet on
two CPU processes, and ``single`` resnet18 at 16 px. A headless chromium (through playwright, as in
tests/e2e/test_browser.py) opens each live run's page, watches it refresh itself for a few seconds,
then the Runs table, round and round. Every 5 s the dashboard process's resident memory is sampled.
At the end the runs still going are cancelled and the script reports:

- "database is locked" errors: in every run's log and in the Streamlit server's output;
- lost epochs: a completed run must have epochs 1..N exactly once; a cancelled one 1..k with no
  gap; and every epoch a run printed to its log must be in the database;
- the dashboard's RSS: after warm-up (the first minute), last, max, and whether it stayed flat
  (last within 20% of the value after warm-up);
- page views, and any page that failed to load or showed an exception.

    python bench/soak.py                      # 10 minutes, writes bench/soak_results.json
    python bench/soak.py --minutes 0.5 --results /tmp/soak.json

Not part of ``make test`` or ``make bench``: it holds the machine for the whole time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.browser import CHROMIUM, CHROMIUM_ARGS, DashboardServer, start_dashboard  # noqa: E402

PYTHON = sys.executable
# One slot per concurrent run; each relaunches its run when it ends.
SLOTS = {
    "single test_resnet": ("--model", "test_resnet", "--image-size", "32", "--epochs", "20"),
    "ddp test_resnet": ("--model", "test_resnet", "--image-size", "32", "--strategy", "ddp", "--devices", "cpu,cpu",
                        "--batch-size", "64", "--epochs", "10"),
    "single resnet18": ("--model", "resnet18", "--image-size", "16", "--epochs", "5"),
}
SAMPLE_S = 5.0
WARM_UP_S = 60.0
FLAT_WITHIN = 0.20
LOCKED = re.compile(r"database is locked", re.IGNORECASE)
PAGE_MS = 60_000


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Soak: three runs at once and a browser on the Run and Runs pages.")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to keep it all going (default 10)")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "soak_results.json",
                        help="where to write the figures as JSON (default bench/soak_results.json)")
    parser.add_argument("--home", type=Path, default=None, help="PARALLAX_HOME to use (default: a new temporary folder)")
    args = parser.parse_args()
    if not args.minutes > 0:
        parser.error(f"--minutes {args.minutes} is not allowed: give a duration above 0")
    return args


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Soak:
    def __init__(self, home: Path, minutes: float):
        self.home, self.duration_s = home, minutes * 60
        self.env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1", "PARALLAX_CPU_RUNS": "3"}
        self.env.pop("PARALLAX_DB_URL", None)
        self.url = ""  # the server's, once it answers
        self.server_log = home / "streamlit.log"
        self.server: DashboardServer | None = None
        self.runs: dict[str, list[int]] = {slot: [] for slot in SLOTS}
        self.rss: list[tuple[float, float]] = []
        self.page_views = {"run": 0, "runs": 0}
        self.page_errors: list[str] = []
        self.start = 0.0
        self.stop = threading.Event()

    # --- the parts -----------------------------------------------------------------------

    def cli(self, *args: str) -> str:
        result = subprocess.run([PYTHON, "-m", "trainer_backend", *args], cwd=ROOT, env=self.env,
                                capture_output=True, text=True, timeout=120)
        if result.returncode not in (0, 1):
            raise RuntimeError(f"trainer_backend {' '.join(args)} failed: {result.stderr}")
        return result.stdout

    def launch(self, slot: str) -> int:
        line = self.cli("launch", "--dataset", "digits", "--tags", "soak", *SLOTS[slot]).strip().splitlines()[-1]
        run_id = int(line.split()[0].split("=")[1])
        self.runs[slot].append(run_id)
        return run_id

    def start_server(self) -> None:
        self.server = start_dashboard(self.env, log=self.server_log)
        self.url = self.server.url

    def sample_memory(self) -> None:
        while not self.stop.is_set():
            value = rss_mb(self.server.process.pid)
            if value is not None:
                self.rss.append((round(time.monotonic() - self.start, 1), round(value, 1)))
            self.stop.wait(SAMPLE_S)

    def keep_runs_going(self) -> None:
        """Relaunch a slot's run when it ends, so three runs train at once the whole time."""
        from db import run_state, make_engine, store

        engine = make_engine(f"sqlite:///{self.home / 'parallax.db'}")
        while not self.stop.wait(2.0):
            run_state.mark_lost_runs(engine)
            for slot, ids in self.runs.items():
                run = store.get_run(engine, ids[-1])
                if run.status not in run_state.ACTIVE_STATUSES and not self.stop.is_set():
                    self.launch(slot)

    def browse(self) -> None:
        """A user with the Run page of each live run open in turn, then the Runs table."""
        from playwright.sync_api import expect, sync_playwright

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1600})
                page.set_default_timeout(PAGE_MS)
                while time.monotonic() - self.start < self.duration_s:
                    for slot in SLOTS:
                        run_id = self.runs[slot][-1]
                        self.view(page, f"/run?run={run_id}", f"Run #{run_id}", "run", expect, watch_ms=4000)
                    self.view(page, "/runs", "Runs", "runs", expect, watch_ms=2000)
            finally:
                browser.close()

    def view(self, page, path: str, heading: str, kind: str, expect, watch_ms: int) -> None:
        try:
            page.goto(self.url + path)
            expect(page.get_by_role("heading", name=heading, exact=True)).to_be_visible(timeout=PAGE_MS)
            page.wait_for_timeout(watch_ms)  # the live part refreshes itself every few seconds meanwhile
            shown = page.get_by_test_id("stException")
            if shown.count():
                self.page_errors.append(f"{path}: {shown.first.inner_text()[:300]}")
            self.page_views[kind] += 1
        except Exception as exc:  # a page that did not load is a finding, not the end of the soak
            self.page_errors.append(f"{path}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")

    # --- the whole soak --------------------------------------------------------------------

    def run(self) -> dict:
        self.start_server()
        for slot in SLOTS:
            self.launch(slot)
        self.start = time.monotonic()
        threads = [threading.Thread(target=self.sample_memory, daemon=True),
                   threading.Thread(target=self.keep_runs_going, daemon=True)]
        for thread in threads:
            thread.start()
        try:
            self.browse()
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(timeout=30)
            elapsed_s = time.monotonic() - self.start
            self.cancel_active()
            self.server.stop(grace_s=30)
        return self.report(elapsed_s)

    def cancel_active(self) -> None:
        from db import run_state, make_engine, store
        from trainer_backend.control.lifecycle import cancel

        engine = make_engine(f"sqlite:///{self.home / 'parallax.db'}")
        for ids in self.runs.values():
            for run_id in ids:
                if store.get_run(engine, run_id).status in run_state.ACTIVE_STATUSES:
                    cancel(run_id)

    def report(self, elapsed_s: float) -> dict:
        runs = [self.check_run(slot, run_id) for slot, ids in self.runs.items() for run_id in ids]
        logs = [self.server_log, *sorted(self.home.glob("runs/run-*/run.log"))]
        locked = {str(path.relative_to(self.home)): len(LOCKED.findall(path.read_text(errors="replace")))
                  for path in logs if path.exists()}
        return {
            "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "minutes": round(elapsed_s / 60, 2),
            "cpu_cores": os.cpu_count(),
            "load_average_1min_at_end": round(os.getloadavg()[0], 2),
            "database_is_locked": {"total": sum(locked.values()),
                                   "files_with_any": {k: v for k, v in locked.items() if v}},
            "runs": runs,
            "epochs_recorded": sum(r["epochs_recorded"] for r in runs),
            "lost_epochs": sum(len(r["lost"]) for r in runs),
            "runs_by_status": {s: sum(r["status"] == s for r in runs) for s in sorted({r["status"] for r in runs})},
            "page_views": self.page_views,
            "page_errors": self.page_errors,
            "streamlit_rss_mb": self.memory_summary(),
        }

    def check_run(self, slot: str, run_id: int) -> dict:
        from db import make_engine, store
        from db.folders import run_folder_name

        engine = make_engine(f"sqlite:///{self.home / 'parallax.db'}")
        run = store.export_run(engine, run_id)
        recorded = [e["epoch"] for e in run["epochs"]]
        planned = int(run["config"]["epochs"])
        expected = list(range(1, planned + 1)) if run["status"] == "completed" else list(range(1, len(recorded) + 1))
        log = self.home / "runs" / run_folder_name(engine, run_id) / "run.log"
        printed = [int(n) for n in re.findall(r"^epoch (\d+)/\d+ ", log.read_text(errors="replace"), re.M)] \
            if log.exists() else []
        lost = sorted((set(expected) | set(printed)) - set(recorded))
        return {"run_id": run_id, "slot": slot, "status": run["status"], "epochs_recorded": len(recorded),
                "planned": planned, "lost": lost, "duplicates": len(recorded) - len(set(recorded)),
                "error": (run["error"] or "").splitlines()[0] if run["status"] == "failed" else None}

    def memory_summary(self) -> dict:
        if not self.rss:
            return {}
        warm = next((mb for t, mb in self.rss if t >= min(WARM_UP_S, self.duration_s / 3)), self.rss[-1][1])
        last = self.rss[-1][1]
        return {"first": self.rss[0][1], "after_warm_up": warm, "last": last, "max": max(mb for _, mb in self.rss),
                "flat": abs(last - warm) <= FLAT_WITHIN * warm, "samples": self.rss}


def main() -> int:
    args = parse_args()
    if not CHROMIUM.exists():
        print(f"error: {CHROMIUM} is missing: apt-get install -y chromium", file=sys.stderr)
        return 2
    home = args.home or Path(tempfile.mkdtemp(prefix="parallax-soak-"))
    home.mkdir(parents=True, exist_ok=True)
    os.environ["PARALLAX_HOME"] = str(home)
    results = Soak(home, args.minutes).run()
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    rss = results["streamlit_rss_mb"]
    print(f"{results['minutes']} min, {len(results['runs'])} runs {results['runs_by_status']}, "
          f"{results['epochs_recorded']} epochs recorded, {results['lost_epochs']} lost; "
          f"'database is locked': {results['database_is_locked']['total']}; "
          f"page views {results['page_views']}, page errors {len(results['page_errors'])}; "
          f"streamlit RSS MB first {rss.get('first')} after warm-up {rss.get('after_warm_up')} "
          f"last {rss.get('last')} max {rss.get('max')} flat={rss.get('flat')}")
    print(f"results: {args.results}; logs and database kept in {home}")
    clean = (results["lost_epochs"] == 0 and results["database_is_locked"]["total"] == 0
             and not results["page_errors"] and rss.get("flat", False)
             and all(r["status"] in ("completed", "cancelled") for r in results["runs"]))
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())

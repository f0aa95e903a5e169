"""Remake the README's screenshots from the runs a new user makes, in a real dashboard and browser.

A fresh dashboard (its own PARALLAX_HOME in a temporary folder) is started and Debian's chromium
drives it through playwright as a user would: Launch with the form's defaults (resnet18 on the
digits, one CPU process) and wait for the run to complete -> docs/img/run-page.png; then Compare
strategies with the form's default sweep (single, ddp, mp, pp on two CPU devices), wait for all of
it, and compare its runs -> docs/img/compare-page.png. About 10 minutes on 2 cores.

    .venv/bin/python docs/screenshots.py
    .venv/bin/python docs/screenshots.py --home /tmp/shots --compare 2,3,4,5   # again from kept runs
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.browser import CHROMIUM, EPOCH_CHART_KEYS, EPOCH_CHARTS, make_run_command  # noqa: E402

IMAGES = ROOT / "docs" / "img"
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
VIEWPORT = {"width": 1400, "height": 1500}  # tall enough for a whole page: Streamlit scrolls inside itself
UI_MS = 120_000
RUN_MS = 30 * 60_000
CHROMIUM_WAIT_S = 600


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_chromium() -> None:
    """Wait for the browser (it may be installing while this starts)."""
    deadline = time.monotonic() + CHROMIUM_WAIT_S
    while not (CHROMIUM.exists() and os.access(CHROMIUM, os.X_OK)):
        if time.monotonic() > deadline:
            sys.exit(f"error: {CHROMIUM} is missing: apt-get install -y chromium")
        time.sleep(5)


def start_dashboard(home: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("PARALLAX_DB_URL", None)
    log = open(home / "streamlit.log", "wb")
    process = subprocess.Popen(
        make_run_command("127.0.0.1", port),  # as make run starts it: the project's config, nothing added
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(120):
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                return process, url
        except OSError:
            time.sleep(0.5)
    process.terminate()
    sys.exit(f"error: the dashboard did not start; see {home / 'streamlit.log'}")


def wait_idle(page) -> None:
    page.wait_for_timeout(500)
    page.get_by_test_id("stStatusWidget").wait_for(state="detached", timeout=UI_MS)


def shoot(page, name: str) -> None:
    page.mouse.move(VIEWPORT["width"] - 5, VIEWPORT["height"] - 5)  # no hover toolbar over a chart
    page.wait_for_timeout(500)
    page.screenshot(path=str(IMAGES / name))


def open_launch_form(page, url: str):
    page.goto(url)
    button = page.get_by_test_id("stBaseButton-primary").filter(has_text="Launch")
    button.wait_for(timeout=UI_MS)
    wait_idle(page)
    return button


def completed_badges(page):
    return page.get_by_role("paragraph").filter(has=page.get_by_role("img", name="check_circle icon"))


def default_run(page, url: str) -> int:
    """Launch with every value as the form offers it; wait until the run has completed."""
    from playwright.sync_api import expect

    open_launch_form(page, url).click()
    page.wait_for_url(re.compile(r"/run\?run=\d+"), timeout=UI_MS)
    run_id = int(re.search(r"run=(\d+)", page.url).group(1))
    expect(completed_badges(page)).to_have_text(re.compile(r"completed$"), timeout=RUN_MS)
    expect(page.locator(EPOCH_CHARTS)).to_have_count(len(EPOCH_CHART_KEYS), timeout=UI_MS)
    wait_idle(page)
    shoot(page, "run-page.png")
    return run_id


def default_sweep(page, url: str) -> None:
    """Compare strategies with the form's defaults; wait until every run has completed."""
    from playwright.sync_api import expect

    open_launch_form(page, url)
    page.get_by_test_id("stRadio").get_by_text("Compare strategies", exact=True).click()
    wait_idle(page)
    page.locator("[data-testid=stBaseButton-primary]:visible", has_text="Launch the sweep").click()
    page.wait_for_url(re.compile(r"/sweep\?sweep=\d+"), timeout=UI_MS)
    expect(completed_badges(page)).to_have_count(4, timeout=RUN_MS)
    wait_idle(page)


def compare(page, run_ids: list[int]) -> None:
    from playwright.sync_api import expect

    page.get_by_test_id("stSidebarNav").get_by_role("link", name="Compare").click()
    picker = page.get_by_test_id("stMultiSelect").filter(has_text="Runs to compare")
    picker.wait_for(timeout=UI_MS)
    for count, run_id in enumerate(run_ids, start=1):
        picker.get_by_role("combobox").click()  # not the middle: a picked run's remove button may be there
        page.keyboard.type(f"#{run_id} ")
        page.get_by_role("option", name=re.compile(f"^#{run_id} ")).click()
        wait_idle(page)
        page.keyboard.press("Escape")
        expect(picker.locator("[data-tag]")).to_have_count(count, timeout=UI_MS)  # the picked runs
    page.locator(".stPlotlyChart").nth(2).wait_for(timeout=UI_MS)
    wait_idle(page)
    shoot(page, "compare-page.png")


def cancel_active_runs(home: Path) -> None:
    """Runs are detached from the dashboard: stop any this script leaves behind."""
    env = {**os.environ, "PARALLAX_HOME": str(home)}
    env.pop("PARALLAX_DB_URL", None)
    listed = subprocess.run([sys.executable, "-m", "trainer_backend", "list"], cwd=ROOT, env=env,
                            capture_output=True, text=True).stdout
    for run_id in re.findall(r"run_id=(\d+) status=(?:queued|running)", listed):
        subprocess.run([sys.executable, "-m", "trainer_backend", "cancel", run_id], cwd=ROOT, env=env,
                       capture_output=True)


def shoot_all(home: Path, compare_only: list[int]) -> None:
    from playwright.sync_api import sync_playwright

    server, url = start_dashboard(home)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(UI_MS)
            if compare_only:
                page.goto(url)
                sweep = compare_only
            else:
                run_id = default_run(page, url)
                print(f"run #{run_id} -> {IMAGES / 'run-page.png'}", flush=True)
                default_sweep(page, url)
                sweep = list(range(run_id + 1, run_id + 5))  # a fresh database numbers them in launch order
            compare(page, sweep)
            print(f"runs {sweep} -> {IMAGES / 'compare-page.png'}", flush=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        cancel_active_runs(home)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--home", type=Path, help="PARALLAX_HOME to use and keep (default: a temporary one)")
    parser.add_argument("--compare", default="", help="only shoot the Compare page of these runs of --home")
    args = parser.parse_args()
    compare_only = [int(n) for n in args.compare.split(",") if n.strip()]
    wait_for_chromium()
    if args.home is not None:
        args.home.mkdir(parents=True, exist_ok=True)
        shoot_all(args.home, compare_only)
        return
    with tempfile.TemporaryDirectory(prefix="parallax-screenshots-") as scratch:
        home = Path(scratch) / "parallax_home"
        home.mkdir()
        shoot_all(home, compare_only)


if __name__ == "__main__":
    main()

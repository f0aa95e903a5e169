"""Time to interactive: how long a freshly started dashboard takes to show its Launch form.

Each repeat starts a new Streamlit server (a new process: nothing imported, nothing cached) on a
new PARALLAX_HOME, waits until it answers its health check, then opens the first page in a new
headless chromium (playwright) and times, from ``page.goto``: the Launch button visible and
enabled (the form is usable), and the parameter count shown (the form complete: the backend's inspector, a
child process of the server, has imported torch and timm, every model listed). Server start-up (process start
to health check) is reported apart.

    python bench/time_to_interactive.py            # 5 repeats
    python bench/time_to_interactive.py --quick    # one repeat
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.browser import CHROMIUM, CHROMIUM_ARGS, browser_missing, dashboard_server  # noqa: E402
from bench.common import parallax_home, parse_args  # noqa: E402
from bench.report import Report  # noqa: E402
from bench.stats import at_most  # noqa: E402

METHOD = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
PAGE_MS = 120_000


def one_open(playwright) -> dict[str, float]:
    from playwright.sync_api import expect

    with parallax_home("parallax-bench-tti-") as home, dashboard_server(home) as (_, url, start_s):
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            started = time.perf_counter()
            page.goto(url)
            button = page.get_by_test_id("stBaseButton-primary").filter(has_text="Launch")
            expect(button).to_be_enabled(timeout=PAGE_MS)
            usable_s = time.perf_counter() - started
            expect(page.get_by_text("parameters for 10 classes")).to_be_visible(timeout=PAGE_MS)
            complete_s = time.perf_counter() - started
        finally:
            browser.close()
    return {"start_s": start_s, "usable_s": usable_s, "complete_s": complete_s}


def main() -> None:
    args = parse_args(__doc__)
    report = Report("time_to_interactive", "Time to interactive", method=METHOD)
    report.settings = {"repeats": args.repeats}
    if missing := browser_missing():
        report.skip(missing)
        report.finish(args)
        return
    from playwright.sync_api import sync_playwright

    opens = []
    with sync_playwright() as playwright:
        for repeat in range(1, args.repeats + 1):
            opens.append(one_open(playwright))
            print(f"  open #{repeat}: " + ", ".join(f"{k} {v:.2f}" for k, v in opens[-1].items()), flush=True)
    report.add("first page load until the Launch button works", [o["usable_s"] for o in opens], unit=" s",
               target=at_most(3.0))
    report.add("first page load until the form is complete (parameter count)", [o["complete_s"] for o in opens],
               unit=" s")
    report.add("server start until it answers", [o["start_s"] for o in opens], unit=" s", headline=False)
    report.note("For comparison: when the form waited for the torch and timm imports, the Launch button appeared "
                "10.6–13.4 s after the first page load.")
    report.finish(args)


if __name__ == "__main__":
    main()

"""The live step charts' feed: what the route answers (status, progress, the points after a step, the whole run
downsampled), the signed links it takes, and the embedded document. The route and the document in a real
server and browser: tests/e2e/test_browser_live.py.

    .venv/bin/python -m pytest tests/ui/test_live_feed.py -q
"""

from __future__ import annotations

import json

from db import run_state, series, store
from ui import live_feed

CONFIG = {"dataset": "digits", "model": "test_resnet", "strategy": "single", "devices": ["cpu"], "epochs": 2}


def points(first: int, last: int) -> list[dict]:
    return [{"epoch": 1 + (s > 100), "step": s, "t_s": 0.5 * s, "train_loss": 2.0 / s, "images_per_s": 100.0 + s,
             "lr": 0.1} for s in range(first, last + 1)]


def test_feed_answers_status_progress_and_the_points_after_a_step(engine):
    run_id = store.create_run(engine, CONFIG, status="running")
    empty = live_feed.feed(engine, run_id, 0)
    assert empty["status"] == "running" and empty["last_step"] == 0 and empty["points"]["step"] == []
    assert empty["whole"] and empty["total_steps"] is None  # before the first step: nothing to draw

    series.add_steps(engine, run_id, points(1, 3))
    run_state.set_progress(engine, run_id, epoch=1, step=3, total_steps=200)
    first = live_feed.feed(engine, run_id, 0)
    assert first["points"]["step"] == [1, 2, 3] and first["points"]["train_loss"] == [2.0, 1.0, 2.0 / 3]
    assert first["points"]["images_per_s"] == [101.0, 102.0, 103.0] and first["points"]["n"] == [1, 1, 1]
    assert (first["epoch"], first["step"], first["total_steps"], first["last_step"]) == (1, 3, 200, 3)

    series.add_steps(engine, run_id, points(4, 5))
    new = live_feed.feed(engine, run_id, 3)
    assert new["points"]["step"] == [4, 5] and not new["whole"]
    assert live_feed.feed(engine, run_id, 5)["points"]["step"] == []  # nothing new: nothing sent
    assert json.dumps(new)  # what the route sends as it is

    run_state.finish(engine, run_id, "completed")
    assert live_feed.feed(engine, run_id, 5)["status"] == "completed"
    assert live_feed.feed(engine, run_id + 1, 0) is None


def test_a_long_run_comes_whole_downsampled_and_new_points_a_page_at_a_time(engine):
    run_id = store.create_run(engine, CONFIG, status="running")
    series.add_steps(engine, run_id, points(1, 3 * live_feed.MAX_POINTS))
    whole = live_feed.feed(engine, run_id, 0)["points"]
    assert len(whole["step"]) <= live_feed.MAX_POINTS + 2 and max(whole["n"]) > 1  # buckets' last points
    assert whole["step"][-1] == 3 * live_feed.MAX_POINTS and whole["step"] == sorted(whole["step"])
    behind = live_feed.feed(engine, run_id, 10)["points"]["step"]
    assert behind == list(range(11, 11 + live_feed.MAX_POINTS))  # the next page; the rest at the next poll


def test_links_are_signed_per_run_and_stay_the_same_for_hours():
    link = live_feed.link(7, prefix="", now=1_000_000.0)
    query = dict(part.split("=") for part in link.split("?")[1].split("&"))
    assert link.startswith(f"{live_feed.ROUTE}/7?")
    assert live_feed.link_problem(7, query["expires"], query["sig"], now=1_000_000.0) is None
    assert live_feed.link(7, prefix="", now=1_000_000.0 + 60) == link  # the embedded document does not change
    assert "not made by this dashboard" in live_feed.link_problem(8, query["expires"], query["sig"], now=1_000_000.0)
    assert "expired" in live_feed.link_problem(7, query["expires"], query["sig"], now=int(query["expires"]) + 1)
    assert "malformed" in live_feed.link_problem(7, "soon", query["sig"])
    assert "malformed" in live_feed.link_problem(7, query["expires"], None)
    assert [live_feed.parse_after(text) for text in ("0", "12", "-1", "x", None, "9" * 13)] == [0, 12, None, None,
                                                                                                None, None]


def test_the_embedded_document_holds_the_link_and_the_pages_chart_layouts_and_no_markup_from_them():
    html = live_feed.feed_html(7)
    settings = json.loads(html.split("const S = ", 1)[1].split(";\n", 1)[0])
    assert settings["feed"].startswith(f"{live_feed.ROUTE}/7?expires=")
    assert settings["layouts"]["train_loss"]["title"]["text"] == "Training loss per step"
    assert settings["layouts"]["images_per_s"]["yaxis"]["title"]["text"] == "images/s (global batch)"
    script = html.split("<script>", 1)[1].rsplit("</script>", 1)[0]
    assert "</" not in script  # nothing in the settings can close the script early

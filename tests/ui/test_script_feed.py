"""A script run's live charts' feed: what the route answers (the series whole as buckets, then the values after
each name's last step), the requests it refuses, and the embedded document. The route and the document in a
real server and browser: tests/e2e/test_browser_script_live.py.

    .venv/bin/python -m pytest tests/ui/test_script_feed.py -q
"""

from __future__ import annotations

import json
import math

from db import run_state, script_metrics
from ui import live_feed, script_feed


def test_the_first_answer_is_each_series_whole_in_buckets_then_only_what_is_new(engine):
    run_id = script_metrics.create_script_run(engine, name="s", project="p", config={}, key="script:feed")
    values = [1.0] * 5000
    values[1234], values[4000] = 100.0, math.nan  # a spike and a NaN the buckets keep
    script_metrics.add_points(engine, run_id, [("train/loss", step, step * 0.001, value)
                                               for step, value in enumerate(values)])
    script_metrics.add_points(engine, run_id, [("val/acc", step, 1.0, 0.5) for step in range(0, 5000, 100)])
    whole = script_feed.feed(engine, run_id, ["train/loss", "val/acc", "never"])
    assert whole["status"] == "running" and whole["whole"] and sorted(whole["names"]) == ["train/loss", "val/acc"]
    loss = whole["names"]["train/loss"]
    assert len(loss["step"]) <= script_feed.MAX_BUCKETS and max(loss["n"]) > 1 and loss["step"][-1] == 4999
    assert max(value for value in loss["max"] if value is not None) == 100.0 and sum(loss["nonfinite"]) == 1
    acc = whole["names"]["val/acc"]
    assert acc["step"] == list(range(0, 5000, 100)) and acc["min"] == acc["max"] == acc["value"]  # values of their own
    json.dumps(whole, allow_nan=False)  # what the route sends: no NaN in it

    script_metrics.add_points(engine, run_id, [("train/loss", step, 5.0, 0.5) for step in range(5000, 5010)])
    new = script_feed.feed(engine, run_id, ["train/loss", "val/acc"], {"train/loss": 4999, "val/acc": 4900})
    assert not new["whole"] and new["names"]["train/loss"]["step"] == list(range(5000, 5010))
    assert new["names"]["val/acc"]["step"] == []
    run_state.finish(engine, run_id, "completed")
    assert script_feed.feed(engine, run_id, ["val/acc"], {"val/acc": 4900})["status"] == "completed"
    assert script_feed.feed(engine, run_id + 1, ["val/acc"]) is None


def test_requests_are_refused_with_what_is_allowed():
    assert script_feed.parse_request(["a", "b"], []) == (["a", "b"], None)
    assert script_feed.parse_request(["a", "b"], ["-1", "12"]) == (["a", "b"], {"a": -1, "b": 12})
    assert script_feed.parse_request([], []) == "name must be given 1 to 12 times; got 0."
    assert "got 13" in script_feed.parse_request([str(n) for n in range(13)], [])
    assert script_feed.parse_request(["a", "b"], ["1"]) == "after must be given once for each name (2); got 1."
    assert script_feed.parse_request(["a"], ["x"]) == "after must be a step number from -1 up; got 'x'."
    assert "from -1 up" in script_feed.parse_request(["a"], ["-2"])


def test_the_embedded_document_holds_the_signed_link_the_names_by_prefix_and_no_markup_from_them():
    html = script_feed.feed_html(7, {"lr<": ["lr</script>"], "train": ["train/acc", "train/loss"]}, log_loss=True)
    settings = json.loads(html.split("const S = ", 1)[1].split(";\n", 1)[0])
    assert settings["feed"].startswith(f"{script_feed.ROUTE}/7?expires=")
    expires, sig = settings["feed"].split("expires=")[1].split("&sig=")
    assert live_feed.link_problem(7, expires, sig) is None and live_feed.link_problem(8, expires, sig) is not None
    assert settings["groups"] == {"lr<": ["lr</script>"], "train": ["train/acc", "train/loss"]}
    assert settings["layouts"]["train/loss"]["yaxis"]["type"] == "log"  # a loss, with the log switch on
    assert settings["layouts"]["train/acc"]["yaxis"].get("type") != "log"
    script = html.split("<script>", 1)[1].rsplit("</script>", 1)[0]
    assert "</" not in script  # nothing in the settings can close the script early
    assert settings["layouts"]["train/acc"]["title"]["text"] == "train/acc"
    assert script_feed.height_px({"train": ["train/loss", "train/acc", "train/lr"]}) > script_feed.height_px(
        {"train": ["train/loss", "train/acc"]})

"""A live chart's ask for a script run's values after the last step it holds (``read_points_after``): by
name, each after its own step, bounded, and never a value twice when a block of steps is written again."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import delete, insert, select

from db import make_engine, point_chunks, script_metrics
from db.point_chunks import BLOCK_STEPS
from db.tables import ScriptChunk, ScriptSeries


def script_run(engine) -> int:
    return script_metrics.create_script_run(engine, name="s", project="p", config={}, key="script:live")


def test_each_name_comes_after_its_own_step_and_only_the_names_asked(backend_db_url):
    engine = make_engine(backend_db_url)
    run_id = script_run(engine)
    script_metrics.add_points(engine, run_id, [("loss", step, step * 0.01, 1.0 / (step + 1)) for step in range(1000)])
    script_metrics.add_points(engine, run_id, [("acc", step, step * 0.01, step / 1000) for step in range(0, 1000, 10)])
    script_metrics.add_points(engine, run_id, [("lr", step, 0.0, 0.1) for step in range(1000)])
    script_metrics.add_points(engine, run_id, [("loss", 1000, 10.0, math.nan)])

    found = script_metrics.read_points_after(engine, run_id, {"loss": 500, "acc": 480, "unknown": 0}, limit=5000)
    assert sorted(found) == ["acc", "loss"]  # lr not asked for; a name never logged left out
    assert script_metrics.metric_count(engine, run_id) == 3 and script_metrics.metric_count(engine, run_id + 1) == 0
    assert found["loss"]["step"] == list(range(501, 1001))
    assert found["loss"]["value"][0] == pytest.approx(1 / 502) and found["loss"]["value"][-1] is None  # NaN: null
    assert found["loss"]["t_s"][0] == pytest.approx(5.01)
    assert found["acc"]["step"] == list(range(490, 1000, 10))
    assert not found["loss"]["more"] and not found["acc"]["more"]
    nothing = script_metrics.read_points_after(engine, run_id, {"loss": 1000, "acc": 990}, limit=5000)
    assert nothing == {"loss": {"step": [], "t_s": [], "value": [], "more": False},
                       "acc": {"step": [], "t_s": [], "value": [], "more": False}}


def test_an_answer_is_bounded_and_the_rest_comes_at_the_next_ask(engine):
    run_id = script_run(engine)
    script_metrics.add_points(engine, run_id, [("loss", step, 0.0, float(step)) for step in range(1, 100_001)])
    script_metrics.add_points(engine, run_id, [("loss", 100_000, 0.0, -1.0)])  # a step logged twice: both kept
    seen, after, asks = [], 0, 0
    while True:
        answer = script_metrics.read_points_after(engine, run_id, {"loss": after}, limit=700)["loss"]
        asks += 1
        assert len(answer["step"]) <= 701  # both values of a step logged twice come together
        seen += answer["step"]
        if not answer["more"]:
            break
        after = answer["step"][-1]
    assert seen == list(range(1, 100_001)) + [100_000]
    assert asks <= 1.1 * 100_000 / 700  # answers near the limit: a block's values before ``after`` are not counted


def test_a_block_written_again_is_not_sent_twice(engine):
    """Values reach the database a batch at a time, so one block of steps may be in several chunks, or be
    written again as one chunk holding more of it: the values come by step, each once."""
    run_id = script_run(engine)
    script_metrics.add_points(engine, run_id, [("loss", step, 0.0, float(step)) for step in range(0, 50)])
    script_metrics.add_points(engine, run_id, [("loss", step, 0.0, float(step)) for step in range(50, 100)])
    first = script_metrics.read_points_after(engine, run_id, {"loss": 40}, limit=1000)["loss"]["step"]
    assert first == list(range(41, 100))
    with engine.begin() as connection:  # block 0 again, as one chunk that has grown to the block's end
        series_id = connection.scalar(select(ScriptSeries.id).where(ScriptSeries.run_id == run_id))
        connection.execute(delete(ScriptChunk).where(ScriptChunk.series_id == series_id))
        grown = point_chunks.pack(range(BLOCK_STEPS + 5), [0.0] * (BLOCK_STEPS + 5), [float(s) for s in range(BLOCK_STEPS + 5)])
        connection.execute(insert(ScriptChunk.__table__), [{**row, "series_id": series_id} for row in grown])
    after = script_metrics.read_points_after(engine, run_id, {"loss": 99}, limit=1000)["loss"]["step"]
    assert after == list(range(100, BLOCK_STEPS + 5))


def test_a_limit_below_one_is_refused(engine):
    with pytest.raises(ValueError, match="limit must be a whole number of 1 or more; got 0"):
        script_metrics.read_points_after(engine, script_run(engine), {"loss": 0}, limit=0)

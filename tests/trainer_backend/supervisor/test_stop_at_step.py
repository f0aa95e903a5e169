"""A torchrun job told to stop (the file the Slurm batch script touches on USR1: rank/stopping.py) stops
every rank at the same step boundary mid-epoch, saves a resume point there, and its next attempt continues at
the next step: each epoch recorded once, each step point once, and the same numbers as a run never stopped.
Real torchrun agents in real subprocesses, gloo on CPU, one SQLite file.

    .venv/bin/python -m pytest tests/trainer_backend/supervisor/test_stop_at_step.py -q
"""

from __future__ import annotations

import re

import pytest

from tests.trainer_backend.supervisor.test_torchrun import assert_matches_a_run_spawned_in_one_go, finish, runs_of, start_agent
from trainer_backend.rank.stopping import STOP_CHECK_ENV, STOP_FILE

pytestmark = pytest.mark.processes

DIGITS_TRAIN = 1437
ASK_AT = 7


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "pp"])
def test_a_job_told_to_stop_mid_epoch_resumes_at_the_next_step_and_records_each_epoch_once(parallax_home, strategy):
    batch = 32  # 16 a rank under ddp and fsdp: 45 steps an epoch, several checks of the stop request each
    # pp: every stage takes the whole batch, in 4 microbatches, and drops a short last one.
    steps_per_epoch, forwards = (-(-DIGITS_TRAIN // 2 // 16), 1) if strategy != "pp" else (DIGITS_TRAIN // batch, 4)
    flags = ["--dataset", "digits", "--model", "parallax_asks_to_stop", "--image-size", "16", "--epochs", "3",
             "--strategy", strategy, "--batch-size", str(batch)]
    # Every process would abort if its interpreter shut down, as one of a gloo world with FSDP sometimes does:
    # each attempt's processes, stopped or done, leave without that shutdown, so the job still ends 0.
    # Under ddp: rank 0 writes its points 3 s slower (tests/plugins/slow_step_point.py), and rank 1, done with its
    # part of the point at the step long before, must not leave (and have torchrun stop rank 0 mid-save) until
    # then; the batches are flipped and cropped by each rank's own generators, which resume where they were; and
    # a CPU package counter (tests/plugins/steady_rapl.py) meters each epoch's energy.
    plugins = "tests.plugins.stop_asking_model,tests.plugins.abort_at_exit" + (
        ",tests.plugins.slow_step_point,tests.plugins.steady_rapl" if strategy == "ddp" else "")
    if strategy == "ddp":
        flags += ["--augment", "flip,crop"]
    env = {"PARALLAX_PLUGINS": plugins,
           "PARALLAX_STEP_POINT_S": "1e-6",  # a point a step
           "PARALLAX_TEST_ASK_AT": str((steps_per_epoch + ASK_AT) * forwards),  # in step ASK_AT of epoch 2
           STOP_CHECK_ENV: "1e-6"}  # a look after every step
    agent = start_agent(parallax_home, ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1"],
                        [*flags, "--devices", "cpu"], env_extra=env)
    ((code, out, err),) = finish([agent])
    assert code == 0, out + err

    (run,) = runs_of(parallax_home)
    assert run["status"] == "completed" and run["error"] is None, run["error"]
    assert [e["epoch"] for e in run["epochs"]] == [1, 2, 3]
    for epoch in (1, 2, 3):
        assert out.count(f"epoch {epoch}/3 ") == 1, out
    stopped = [re.fullmatch(r"The job was told to stop and stopped after step (\d+) of epoch 2, its resume point "
                            r"saved there\.", note) for note in run["notes"]]
    (step,) = [int(m.group(1)) for m in stopped if m] or pytest.fail(f"{run['notes']}\n{err[-3000:]}")
    # Asked in step ASK_AT of epoch 2 (earlier where forwards outside the steps count too: BatchNorm's re-estimate
    # a step, a pipeline's shape inference and evaluation several): the look after it asks, the next look's
    # answer stops both ranks.
    if strategy == "pp":
        assert 1 <= step <= ASK_AT + 1, (step, run["notes"])
    else:
        assert ASK_AT - 1 <= step <= ASK_AT + 1, (step, run["notes"])
    assert any(note.startswith(f"Resumed at step {step + 1} of epoch 2, from the point saved when the job was told")
               for note in run["notes"]), run["notes"]
    assert not any((parallax_home / "runs").rglob(STOP_FILE))  # taken: a later attempt does not stop
    # Every step recorded once: those before the stop by the first attempt, the rest by the second.
    assert [s["step"] for s in run["steps"]] == list(range(1, 3 * steps_per_epoch + 1))
    assert [s["epoch"] for s in run["steps"]] == [e for e in (1, 2, 3) for _ in range(steps_per_epoch)]

    # The same training spawned in one go (nothing asks it to stop): the resumed epoch covers all its steps,
    # with the weights, the optimizer and the shuffle restored at the step, so every epoch matches.
    assert_matches_a_run_spawned_in_one_go(parallax_home, run, flags, env)
    # Images per second over the epoch's training time in both attempts, not the second attempt's alone.
    second = run["epochs"][1]
    assert second["images_per_s"] * second["train_time_s"] == pytest.approx(DIGITS_TRAIN, rel=0.05)
    if strategy == "ddp":  # the energy metered from the resume, per image of the images trained since
        joules, images = sum(second["extra"]["energy_j"].values()), round(second["images_per_s"] * second["train_time_s"])
        assert joules > 0 and second["extra"]["energy_j_per_image"] == pytest.approx(
            joules / (images - step * batch), rel=1e-6), second["extra"]

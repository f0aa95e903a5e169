"""A real search on CPU, from the command line: 8 trials on digits, 2 at once, with the median pruner, each trial
an ordinary run. Its launcher is killed outright while trials train, and ``parallax search --resume`` carries the
search to its end. One search, shared by the tests that read it (the module's fixture); each trial trains the
sleeping test model (tests/plugins/sleeping_model.py), whose epochs pass at a steady pace and cost next to no
CPU, so the pruner's verdict lands while a trial still has epochs to go. Bad input is refused before anything is
recorded.

    .venv/bin/python -m pytest tests/trainer_backend/control/test_search.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from db import dispose_engines, make_engine, store
from db.search_study import forget_storages
from db.searches import get_search, list_searches, trial_runs
from tests.support import ROOT, SLEEPER, SLEEPER_ENV, run_cli

TRIALS, AT_ONCE, EPOCHS = 8, 2, 3
SEARCH = (*SLEEPER, "--batch-size", "32", "--epochs", str(EPOCHS), "--param", "lr=1e-4:1e-1:log",
          "--param", "batch_size=32,64", "--trials", str(TRIALS), "--at-once", str(AT_ONCE), "--pruner", "median")
ENV = {**SLEEPER_ENV, "PARALLAX_CPU_RUNS": str(AT_ONCE)}
KILL_AFTER_RUNS = 3  # the launcher is killed once its third trial is launched: two trials train then
WITHIN_S = 600.0


def active_runs(engine, search_id: int) -> list[int]:
    return [run["id"] for run in trial_runs(engine, search_id).values() if run["status"] in ("queued", "running")]


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    """The search: started, its launcher killed (SIGKILL) with two trials training, then resumed to its end."""
    home = tmp_path_factory.mktemp("search-home")
    url = f"sqlite:///{home / 'parallax.db'}"
    env = {**os.environ, "PARALLAX_HOME": str(home), "PYTHONUNBUFFERED": "1", **ENV}
    env.pop("PARALLAX_DB_URL", None)
    launcher = subprocess.Popen([sys.executable, "-m", "trainer_backend", "search", *SEARCH], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + WITHIN_S
        while time.monotonic() < deadline and launcher.poll() is None:
            if (home / "parallax.db").exists() and list_searches(make_engine(url)):
                if len(trial_runs(make_engine(url), 1)) >= KILL_AFTER_RUNS:
                    break
            time.sleep(0.2)
        assert launcher.poll() is None, launcher.communicate()[0]
        os.killpg(launcher.pid, signal.SIGKILL)  # the launcher alone: each trial's supervisor has a session of its own
        first_output = launcher.communicate(timeout=30)[0]
    finally:
        if launcher.poll() is None:
            launcher.kill()
    engine = make_engine(url)
    training_at_kill = active_runs(engine, 1)
    driver_at_kill = get_search(engine, 1)
    resumed = run_cli("search", "--resume", "1", home=home, env_extra=ENV, timeout=WITHIN_S)
    listed_pruned = run_cli("list", "--status", "pruned", home=home, timeout=120)
    yield SimpleNamespace(home=home, url=url, engine=engine, first_output=first_output, resumed=resumed,
                          training_at_kill=training_at_kill, driver_at_kill=driver_at_kill, listed_pruned=listed_pruned)
    forget_storages()
    dispose_engines()


def study_of(search):
    import optuna

    from db.search_study import study_storage

    return optuna.load_study(study_name=get_search(search.engine, 1).study_name, storage=study_storage(search.url))


def test_the_resumed_search_ends_with_every_trial_told_and_its_answer(search):
    assert search.resumed.returncode == 0, search.resumed.stdout + search.resumed.stderr
    lines = search.resumed.stdout.splitlines()
    assert lines[-1] == "search_id=1 status=finished"
    assert any(line.startswith("launch with these settings: parallax launch ") for line in lines), lines
    states = [t.state.name for t in study_of(search).trials]
    assert len(states) == TRIALS and set(states) <= {"COMPLETE", "PRUNED"}, states
    assert get_search(search.engine, 1).status == "finished"


def test_every_trial_is_an_ordinary_run_of_the_search(search):
    runs = trial_runs(search.engine, 1)
    assert sorted(runs) == list(range(TRIALS))
    for number, run in runs.items():
        assert run["status"] in ("completed", "pruned"), (number, run)
        assert 1e-4 <= run["config"]["lr"] <= 1e-1 and run["config"]["batch_size"] in (32, 64)
        trial = study_of(search).trials[number]
        assert trial.user_attrs["run_id"] == run["id"]
        assert run["config"]["lr"] == pytest.approx(trial.params["lr"])
    completed = [r["id"] for r in runs.values() if r["status"] == "completed"]
    best = max(e["val_acc"] for e in store.read_epoch_metrics(search.engine, completed))
    assert study_of(search).best_value == pytest.approx(best)


def test_at_most_two_trials_train_at_once_and_two_did(search):
    runs = [r for r in trial_runs(search.engine, 1).values() if r["started_at"] is not None]
    events = sorted([(r["started_at"], 1) for r in runs] + [(r["finished_at"], -1) for r in runs])
    at_once, most = 0, 0
    for _, change in events:
        at_once += change
        most = max(most, at_once)
    assert most == AT_ONCE


def test_the_pruner_prunes_and_a_pruned_trial_keeps_its_epochs(search):
    runs = trial_runs(search.engine, 1)
    pruned = {number: run for number, run in runs.items() if run["status"] == "pruned"}
    assert pruned, {n: r["status"] for n, r in runs.items()}
    study = study_of(search)
    for number, run in pruned.items():
        epochs = [e["epoch"] for e in store.read_epoch_metrics(search.engine, [run["id"]])]
        assert 1 <= len(epochs) < EPOCHS and epochs == list(range(1, len(epochs) + 1))
        assert run["error"].startswith("pruned by the search's median pruner after epoch"), run["error"]
        assert study.trials[number].state.name == "PRUNED"
        assert sorted(study.trials[number].intermediate_values) == epochs[:len(study.trials[number].intermediate_values)]
    assert search.listed_pruned.returncode == 0
    assert {f"run_id={run['id']} status=pruned" for run in pruned.values()} <= {
        " ".join(line.split()[:2]) for line in search.listed_pruned.stdout.splitlines()}


def test_a_killed_launcher_leaves_its_trials_training_and_the_resume_follows_them_to_their_end(search):
    assert "status=finished" not in search.first_output
    assert search.training_at_kill, "no trial was training when the launcher was killed"
    assert search.driver_at_kill.driver_pid is not None and not search.driver_at_kill.driven_here_by_a_live_process
    ends = {run["id"]: run["status"] for run in trial_runs(search.engine, 1).values()}
    for run_id in search.training_at_kill:
        assert ends[run_id] in ("completed", "pruned")  # trained on, then judged by the new driver
        assert f"run_id={run_id} followed again" in search.resumed.stdout
    assert not any(line.startswith("trial=") and "failed" in line for line in search.resumed.stdout.splitlines())


@pytest.mark.parametrize("flags, said", [
    (("--param", "lr=0:1:log"), "error: --param 'lr=0:1:log' is not allowed: a log range needs LOW above 0"),
    (("--strategy", "ddp", "--devices", "cpu,cpu", "--param", "batch_size=3,4"),
     "error: --param batch_size=3,4: batch_size=3 cannot run: batch_size 3 is the global batch and must divide "
     "evenly over 2 DDP processes"),
    (("--param", "lr=1e-4:1e-1:log", "--objective", "acc_and_speed", "--pruner", "median"),
     "error: --pruner median is not allowed with --objective acc_and_speed"),
    (("--resume", "7",), "error: no search with id 7"),
])
def test_bad_input_is_refused_in_one_line_before_anything_is_recorded(parallax_home, flags, said):
    result = run_cli("search", *flags, home=parallax_home, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip().splitlines()[0]]
    assert result.stderr.startswith(said), result.stderr
    assert "search_id=" not in result.stdout
    database = parallax_home / "parallax.db"
    assert not database.exists() or (not list_searches(make_engine(f"sqlite:///{database}"))
                                     and not store.list_runs(make_engine(f"sqlite:///{database}")))

"""The process that drives a search: it draws each trial from the search's Optuna study, launches it as an ordinary
run, follows its epochs in the database, reports each epoch's figure to the study, prunes the trials the pruner
judges hopeless (they end ``pruned``, their epochs kept) and tells the study how each trial ended.

    status = drive(search_id, db_url=url)      # "finished", or "stopped" (SIGTERM or Ctrl-C)

Everything it needs is in the database: the search's row (base config, space), the study (Optuna's tables
there) and the trials' runs (``runs.search_id``, ``runs.search_trial``). So a driver killed outright leaves a
search another driver carries on (``parallax search --resume N``): trials whose runs are still training are
followed again, those that ended meanwhile are told, and a trial drawn but never launched is failed. Stopped
(SIGTERM, Ctrl-C), a driver cancels the trials it has running and leaves the search to be resumed.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from contract.config import ConfigError, RunConfig
from contract.printable import one_line
from contract.search_space import (Choices, Range, SearchSpace, described, epoch_figure, objective_values,
                                   trial_config)
from db import make_engine, store
from db import run_state
from db.search_study import study_storage
from db.searches import add_search_notes, claim_driver, get_search, release_driver, trial_runs

POLL_S = 0.5
RUN_KEY = "run_id"  # the trial's user attribute naming its run
FORECAST_KEY = "forecast_mb"  # a speed trial's forecast peak per device
PLANNED_KEY = "speed_trials_planned"  # the study's user attribute: a speed search's candidates are enqueued


class SearchBusy(ValueError):
    """Another live process on this machine drives the search already."""


@dataclass
class Followed:
    """A trial whose run the driver follows: the epochs reported so far."""

    number: int
    run_id: int
    epochs: int  # the run's, from its config
    reported: set[int] = field(default_factory=set)
    prune_asked: bool = False


def make_sampler(space: SearchSpace):
    import optuna

    if space.sampler == "random":
        return optuna.samplers.RandomSampler(seed=space.seed)
    if space.sampler == "grid":
        return optuna.samplers.GridSampler({p.name: list(p.values) for p in space.params}, seed=space.seed)
    # constant_liar: trials drawn while others run are kept apart from those still running
    return optuna.samplers.TPESampler(seed=space.seed, constant_liar=space.at_once > 1, multivariate=True)


def make_pruner(space: SearchSpace, epochs: int):
    """The pruner a space names. The median pruner starts judging once a quarter of the trials (2 to 5) have
    finished: Optuna's default of 5 would leave a search of 8 trials almost nothing to prune."""
    import optuna

    if space.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=min(5, max(2, space.trials // 4)), n_warmup_steps=0)
    if space.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1)
    if space.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(1, epochs))
    return optuna.pruners.NopPruner()


def open_study(url: str, search):
    """The search's study, made the first time (its enqueued trials with it, for a speed search)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the driver says what happens in its own lines
    space = SearchSpace.from_dict(search.space)
    base = RunConfig.from_dict(search.config)
    return optuna.create_study(study_name=search.study_name, storage=study_storage(url), load_if_exists=True,
                               directions=list(space.directions), sampler=make_sampler(space),
                               pruner=make_pruner(space, base.epochs))


def suggest(trial, param) -> object:
    if isinstance(param, Choices):
        return trial.suggest_categorical(param.name, list(param.values))
    if isinstance(param, Range) and isinstance(param.low, int) and isinstance(param.high, int):
        return trial.suggest_int(param.name, param.low, param.high, log=param.log)
    return trial.suggest_float(param.name, float(param.low), float(param.high), log=param.log)


class Driver:
    """One search driven to its end (or until stopped) by this process."""

    def __init__(self, search_id: int, *, db_url: str | None = None, data_roots: list[Path] | None = None,
                 echo: Callable[[str], None] | None = None):
        from contract.environment import database_url
        from db.connection import absolute_database_url

        self.url = absolute_database_url(database_url(db_url))
        self.engine = make_engine(self.url)
        self.search_id = search_id
        self.data_roots = data_roots
        self.echo = echo or (lambda line: print(line, flush=True))
        search = get_search(self.engine, search_id)
        if search is None:
            raise LookupError(f"no search with id {search_id}")
        self.search = search
        self.space = SearchSpace.from_dict(search.space)
        self.base = RunConfig.from_dict(search.config)
        self.followed: dict[int, Followed] = {}
        self.stop_asked = False
        self.started_at = search.created_at.timestamp()
        self.said_why_no_more = False

    # --- the loop -------------------------------------------------------------------------------

    def drive(self) -> str:
        if not claim_driver(self.engine, self.search_id):
            raise SearchBusy(f"search {self.search_id} is driven by process {self.search.driver_pid} on this machine "
                             "already: follow it on the Search page, or stop that process first")
        import optuna

        self.optuna = optuna
        status = "stopped"
        try:
            self.study = open_study(self.url, self.search)
            if self.space.kind == "speed" and not self.study.user_attrs.get(PLANNED_KEY):
                self.plan_speed_trials()
            self.adopt_trials()
            while True:
                self.follow()
                if self.stop_asked:
                    self.cancel_followed()
                    break
                if self.base.where == "slurm":
                    if self.may_start_another():
                        self.start_slurm_array()
                else:
                    while len(self.followed) < self.space.at_once and self.may_start_another():
                        self.start_trial()
                if not self.followed and not self.may_start_another():
                    status = "finished"
                    break
                time.sleep(POLL_S)
        finally:
            release_driver(self.engine, self.search_id, status)
        return status

    def tell(self, trial, values=None, **options) -> None:
        """``study.tell``. The grid sampler asks the study to stop once its last point is told, which Optuna allows
        only inside ``optimize``: the trial is stored before it asks, and the driver stops on its own budget."""
        try:
            self.study.tell(trial, values, **options)
        except RuntimeError as exc:
            if "Study.stop" not in str(exc):
                raise

    def ask_to_stop(self, *_) -> None:
        self.stop_asked = True

    def counted_trials(self) -> list:
        """The trials that count against the budget: every one but those that failed (a failed trial's run
        says why; the search draws another in its place), and those waiting to be started."""
        states = self.optuna.trial.TrialState
        return [t for t in self.study.get_trials(deepcopy=False) if t.state not in (states.FAIL, states.WAITING)]

    def failures(self) -> int:
        return sum(t.state == self.optuna.trial.TrialState.FAIL for t in self.study.get_trials(deepcopy=False))

    def may_start_another(self) -> bool:
        if self.stop_asked or len(self.counted_trials()) >= self.space.trials:
            return False
        if self.space.kind == "speed":  # its trials are the candidates enqueued when it was planned, and only they
            waiting = self.optuna.trial.TrialState.WAITING
            if not any(t.state == waiting for t in self.study.get_trials(deepcopy=False)):
                return False
        why = None
        if self.failures() >= max(3, self.space.trials):
            why = f"{self.failures()} trials failed: the search starts no more (each failed run says why)."
        elif self.space.timeout_s and time.time() - self.started_at > self.space.timeout_s:
            why = f"The search's {self.space.timeout_s:g} s were spent: no trial started after them."
        if why is not None and not self.said_why_no_more:
            self.said_why_no_more = True
            add_search_notes(self.engine, self.search_id, [why])
            self.echo(why)
        return why is None

    def plan_speed_trials(self) -> None:
        """A speed search's candidates, judged by the memory forecast before any is launched: those that fit are
        enqueued in the study (the base's own settings first), with their forecast; the others are noted."""
        from trainer_backend.control.speed_search import plan_speed_search

        plan = plan_speed_search(self.base, self.space)
        for candidate in plan.candidates:
            self.study.enqueue_trial(candidate.values, user_attrs={FORECAST_KEY: candidate.forecast_mb},
                                     skip_if_exists=True)
        add_search_notes(self.engine, self.search_id, plan.notes())
        for line in plan.notes():
            self.echo(line)
        self.study.set_user_attr(PLANNED_KEY, True)

    # --- trials ---------------------------------------------------------------------------------

    def draw(self):
        """The next trial and its config; None (the trial failed) where its values break a rule after all."""
        trial = self.study.ask()
        values = {p.name: suggest(trial, p) for p in self.space.params}
        try:
            config = trial_config(self.base, values)
            if self.space.kind == "speed":
                from trainer_backend.control.speed_search import speed_epochs

                config = config.replace(epochs=speed_epochs(config, self.space.timed_steps))
        except ConfigError as exc:  # the space was checked before the search started: a drawn value still broke a rule
            self.tell(trial, state=self.optuna.trial.TrialState.FAIL)
            self.echo(f"trial={trial.number} failed before launch: {described(values)}: {one_line(exc)}")
            return None
        return trial, values, config

    def start_trial(self) -> None:
        drawn = self.draw()
        if drawn is None:
            return
        trial, values, config = drawn
        from trainer_backend.control.lifecycle import launch

        try:
            run_id = launch(config, db_url=self.url, data_roots=self.data_roots,
                            search_trial=(self.search_id, trial.number))
        except Exception as exc:  # noqa: BLE001 - a launch that cannot start (disk full, sbatch refused): the trial says why
            self.tell(trial, state=self.optuna.trial.TrialState.FAIL)
            self.echo(f"trial={trial.number} could not be launched: {one_line(exc)}")
            return
        trial.set_user_attr(RUN_KEY, run_id)
        self.followed[trial.number] = Followed(trial.number, run_id, config.epochs)
        self.echo(f"trial={trial.number} run_id={run_id} started: {described(values)}")

    def start_slurm_array(self) -> None:
        """On Slurm every trial left is drawn now and submitted as one job array, ``at_once`` of them running at a
        time: the sampler learns nothing from trials still to run, so a Slurm search samples as a random (or
        grid) search does, and prunes as any."""
        from trainer_backend.control.slurm_job import submit_array

        drawn = []
        while len(self.counted_trials()) < self.space.trials and (found := self.draw()) is not None:
            drawn.append(found)
        if not drawn:
            return
        try:
            run_ids = submit_array([config for _, _, config in drawn], db_url=self.url, array_limit=self.space.at_once,
                                   search_trials=[(self.search_id, trial.number) for trial, _, _ in drawn])
        except Exception as exc:  # noqa: BLE001 - sbatch refused: every trial says why
            for trial, _, _ in drawn:
                self.tell(trial, state=self.optuna.trial.TrialState.FAIL)
            self.echo(f"trials {drawn[0][0].number}-{drawn[-1][0].number} could not be submitted: {one_line(exc)}")
            return
        for (trial, values, config), run_id in zip(drawn, run_ids):
            trial.set_user_attr(RUN_KEY, run_id)
            self.followed[trial.number] = Followed(trial.number, run_id, config.epochs)
            self.echo(f"trial={trial.number} run_id={run_id} submitted: {described(values)}")

    def adopt_trials(self) -> None:
        """After a driver that stopped or was killed: follow again the trials whose runs still train, tell those
        that ended meanwhile, and fail the ones drawn but never launched."""
        states = self.optuna.trial.TrialState
        runs = trial_runs(self.engine, self.search_id)
        for trial in self.study.get_trials(deepcopy=False, states=(states.RUNNING,)):
            run = runs.get(trial.number)
            if run is None:
                self.tell(trial.number, state=states.FAIL)
                self.echo(f"trial={trial.number} failed: its driver stopped before its run was recorded")
                continue
            if trial.user_attrs.get(RUN_KEY) != run["id"]:
                self.trial(trial.number).set_user_attr(RUN_KEY, run["id"])
            self.followed[trial.number] = Followed(trial.number, run["id"], int(run["config"].get("epochs") or 0),
                                                   set(trial.intermediate_values))
            self.echo(f"trial={trial.number} run_id={run['id']} followed again ({run['status']})")

    def follow(self) -> None:
        """Each followed trial's new epochs reported, a prune asked where the pruner says so, an end told."""
        run_state.mark_lost_runs(self.engine)
        if self.base.where == "slurm":
            from trainer_backend.control.slurm_status import watch_slurm_runs

            watch_slurm_runs(self.engine)
        for number, followed in list(self.followed.items()):
            run = store.get_run(self.engine, followed.run_id)
            if run is None:  # deleted while it trained
                self.tell(number, state=self.optuna.trial.TrialState.FAIL)
                del self.followed[number]
                continue
            epochs = store.read_epoch_metrics(self.engine, [followed.run_id])
            self.report(followed, epochs, active=run.status in run_state.ACTIVE_STATUSES)
            if run.status not in run_state.ACTIVE_STATUSES:
                self.tell_end(followed, run, epochs)
                del self.followed[number]

    def trial(self, number: int):
        """The live trial ``number`` of the study, to report to: Optuna hands one out only from ``ask``, so a trial
        followed again after a restart is rebuilt from its id (Optuna's own storage call)."""
        from optuna.trial import Trial

        storage = self.study._storage
        return Trial(self.study, storage.get_trial_id_from_study_id_trial_number(self.study._study_id, number))

    def report(self, followed: Followed, epochs: list[dict], *, active: bool) -> None:
        trial = self.trial(followed.number)
        for epoch in epochs:
            if epoch["epoch"] in followed.reported:
                continue
            figure = epoch_figure(self.space, epoch)
            followed.reported.add(epoch["epoch"])
            if figure is None or len(self.space.directions) > 1:
                continue
            trial.report(figure, epoch["epoch"])
            last_epoch = epoch["epoch"] >= followed.epochs
            if active and not followed.prune_asked and not last_epoch and trial.should_prune():
                followed.prune_asked = True
                from trainer_backend.control.lifecycle import prune

                why = (f"pruned by the search's {self.space.pruner} pruner after epoch {epoch['epoch']}: "
                       f"{self.figure_name()} {figure:.4g} (search {self.search_id}, trial {followed.number})")
                prune(followed.run_id, why, db_url=self.url)

    def figure_name(self) -> str:
        return "images/s" if self.space.objective == "images_per_s" else "validation accuracy"

    def tell_end(self, followed: Followed, run, epochs: list[dict]) -> None:
        states = self.optuna.trial.TrialState
        number = followed.number
        if run.status == "pruned":
            self.tell(number, state=states.PRUNED)
            self.echo(f"trial={number} run_id={run.id} status=pruned epochs={len(epochs)}")
            return
        values = objective_values(self.space, epochs) if run.status == "completed" else None
        if values is None:
            self.tell(number, state=states.FAIL)
            why = one_line((run.error or "it recorded no figure to judge it by").splitlines()[0])
            self.echo(f"trial={number} run_id={run.id} status={run.status}: {why}")
            return
        self.tell(number, list(values))
        shown = ", ".join("not reached" if math.isinf(v) else f"{v:.4g}" for v in values)
        self.echo(f"trial={number} run_id={run.id} status=completed {self.space.objective}={shown}")

    def cancel_followed(self) -> None:
        """Stopped: the trials still training are cancelled (each run keeps its epochs) and told as failed, so
        that a resumed search draws others in their place."""
        from trainer_backend.control.lifecycle import CancelNotDelivered, cancel

        for number, followed in list(self.followed.items()):
            try:
                cancel(followed.run_id, db_url=self.url)
            except CancelNotDelivered as exc:
                self.echo(f"error: {exc}")
            self.tell(number, state=self.optuna.trial.TrialState.FAIL, skip_if_finished=True)
            self.echo(f"trial={number} run_id={followed.run_id} cancelled: the search was stopped")
            del self.followed[number]


def drive(search_id: int, *, db_url: str | None = None, data_roots: list[Path] | None = None,
          echo: Callable[[str], None] | None = None) -> str:
    """Drive search ``search_id`` in this process until it ends or SIGTERM/SIGINT stops it; its final status."""
    driver = Driver(search_id, db_url=db_url, data_roots=data_roots, echo=echo)
    previous = {signum: signal.signal(signum, driver.ask_to_stop) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        return driver.drive()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.stdout.flush()

"""What the forkserver of a run's CPU ranks imports before it forks them, where multiprocessing
starts it afresh rather than as a fork of the supervisor (rank_server, runner._spawn_ranks): the
engine, loaded as a process that trains loads it (trainer_backend.supervisor.startup), so that its objects are frozen
before the first rank is forked and the ranks share the pages that hold them."""

from trainer_backend.supervisor.startup import engine_imports

with engine_imports():
    import trainer_backend.supervisor.runner  # noqa: F401

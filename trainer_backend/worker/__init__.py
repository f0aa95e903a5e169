"""The detached worker: one process per run, between the control side and the ranks.

    control.lifecycle.launch ─▶ worker.runner: claim the run, wait its turn (liveness), preflight the data
        and model, start the ranks (spawned, or on CPU forked from rank_server, the worker's own fork),
        sample the system, record how the run ended
    torchrun ─▶ worker.torchrun: the same for a world torchrun started, across machines

Ranks run engine.trainer; the worker only starts, watches and ends them.
"""

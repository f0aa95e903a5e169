"""The detached supervisor: one process per run, between the control side and the ranks.

    control.lifecycle.launch ─▶ supervisor.runner: claim the run, wait its turn (liveness), preflight the data
        and model, start the ranks (spawned, or on CPU forked from rank_server, the supervisor's own fork),
        sample the system, record how the run ended
    torchrun ─▶ supervisor.torchrun: the same for a world torchrun started, across machines

Ranks run rank.trainer; the supervisor only starts, watches and ends them.
"""

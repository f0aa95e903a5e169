"""The system samples of a torchrun job's other machines, carried to rank 0 through torchrun's c10d store.

Only rank 0 writes the database (it may be a SQLite file on rank 0's machine alone). On every other
machine the process of local rank 0 samples its machine (``sampler.SystemSampler``) into a
``StorePusher``; rank 0's sampler takes the rows in with a ``StoreDrain`` at each of its flushes and
writes them with its own. The store is the one the job's processes met at (``MASTER_ADDR``,
``MASTER_PORT``: torchrun's agent store, or the one rank 0 serves for ``env://``). Each sampling
thread has a client of its own: a collective from a sampler would interleave with training's.

Keys, under a prefix of the run and the attempt (``sample_store``):

    node-{n}/{seq}   one flush of node n: JSON {"rows": [...], "notes": [...]}, rows in wall time
    node-{n}/count   how many flushes node n has pushed (set after each one is)
    node-{n}/done    1 once node n's last flush (and its notes) are pushed

    pusher = StorePusher(sample_store(run_id, attempt), node=1)               # a machine of the job
    drain = StoreDrain(sample_store(run_id, attempt), {1: "node 1 (gpu-b)"}, run_started_at_s)  # rank 0
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import torch.distributed as dist

# A store operation that takes longer means rank 0's store is gone: the sampler says so and goes on.
STORE_TIMEOUT_S = 10.0
# How long rank 0 waits, once it has stopped sampling, for the others' last flushes: a machine that
# died must not hold up the end of the run.
DONE_WAIT_S = 5.0


def sample_store(run_id: int, attempt: str, *, host: str | None = None, port: int | None = None,
                 timeout_s: float = STORE_TIMEOUT_S) -> dist.Store:
    """A client of the job's store (``MASTER_ADDR``:``MASTER_PORT`` unless given) under keys of this
    run and attempt alone (``attempt``: a name rank 0 gives each attempt), so that a restarted
    attempt, or another run, never reads these batches."""
    client = dist.TCPStore(host or os.environ["MASTER_ADDR"], int(port or os.environ["MASTER_PORT"]),
                           is_master=False, timeout=timedelta(seconds=timeout_s))
    return dist.PrefixStore(f"parallax/samples/run-{run_id}/attempt-{attempt}/", client)


class StorePusher:
    """The sink of a machine's sampler that sends its rows to rank 0 (``sampler.Sink``)."""

    def __init__(self, store: dist.Store, node: int):
        self.store, self.node = store, node
        self.why_dropped = "rank 0 could not be reached through torchrun's store"
        self._seq = 0

    def write(self, rows: list[dict]) -> bool:
        return self._push(rows, [])

    def close(self, notes: list[str]) -> None:
        if notes:
            self._push([], notes)
        self._try(lambda: self.store.add(f"node-{self.node}/done", 1))

    def _push(self, rows: list[dict], notes: list[str]) -> bool:
        def push():
            self.store.set(f"node-{self.node}/{self._seq}", json.dumps({"rows": rows, "notes": notes}))
            self._seq += 1
            # After the batch: a counted batch is there to read. Set, not added to: a count that
            # reached the store although the call timed out here is set again by the next push,
            # never counted twice, so no batch number is left without its batch.
            self.store.set(f"node-{self.node}/count", str(self._seq))
        return self._try(push)

    def _try(self, operation) -> bool:
        try:
            operation()
            return True
        except Exception as exc:  # the store is gone or slow: the samples are lost, training goes on
            self.why_dropped = f"rank 0 could not be reached through torchrun's store ({type(exc).__name__}: {exc})"
            return False


class StoreDrain:
    """Rank 0's source of the other machines' rows (``sampler.ExtraRows``): each batch is read once
    and deleted, its rows' wall times made the run's ``t_s``. ``machines`` names each node to
    await, {node: name for notes}."""

    def __init__(self, store: dist.Store, machines: dict[int, str], started_at_s: float, *,
                 done_wait_s: float = DONE_WAIT_S):
        self.store, self.machines, self.started_at_s = store, dict(machines), started_at_s
        self.done_wait_s = done_wait_s
        self._taken = {node: 0 for node in self.machines}
        self._notes: list[str] = []
        self._missing: list[int] = []
        self._error: str | None = None

    def rows(self) -> list[dict]:
        rows = []
        for node in self.machines:
            try:
                count = self.store.add(f"node-{node}/count", 0)  # adding 0 reads the count
                while self._taken[node] < count:
                    key = f"node-{node}/{self._taken[node]}"
                    batch = json.loads(self.store.get(key))
                    self.store.delete_key(key)
                    self._taken[node] += 1
                    rows += [{**row, "node": node, "t_s": round(row["t_s"] - self.started_at_s, 3)}
                             for row in batch["rows"]]
                    self._notes += batch["notes"]
            except Exception as exc:  # tried again at the next flush; said once at the end
                self._error = self._error or f"{type(exc).__name__}: {exc}"
        return rows

    def finish(self) -> list[dict]:
        waiting, deadline = set(self.machines), time.monotonic() + self.done_wait_s
        rows = []
        while waiting:
            rows += self.rows()  # taken in while waiting: the store holds less at any moment
            try:
                waiting = {node for node in waiting if not self.store.add(f"node-{node}/done", 0)}
            except Exception as exc:
                self._error = self._error or f"{type(exc).__name__}: {exc}"
                break
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        rows += self.rows()
        self._missing = sorted(waiting)
        return rows

    def notes(self) -> list[str]:
        notes = list(self._notes)
        for node in self._missing:
            which = f"The last system samples of {self.machines[node]} are missing" if self._taken[node] else \
                f"No system samples of {self.machines[node]} reached rank 0"
            notes.append(f"{which}: its sampler had not said it finished {self.done_wait_s:g} s after rank 0's (it "
                         "failed, could not reach torchrun's store, or its machine or connection failed).")
        if self._error:
            notes.append(f"Some system samples of the run's other machines may be missing: reading them from "
                         f"torchrun's store failed ({self._error}).")
        return notes

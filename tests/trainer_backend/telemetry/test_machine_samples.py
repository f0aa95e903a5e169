"""The system samples of a run across machines: the other machines' samples carried to rank 0
through a real c10d ``TCPStore`` (this process serves it, as torchrun's agent or rank 0 does; the
"remote" machine is a client in a thread), written into a real database, read back thinned per
machine, named per machine in charts and export, and combined across machines in Compare and the
sweep report.

    .venv/bin/python -m pytest tests/trainer_backend/telemetry/test_machine_samples.py -q
"""

from __future__ import annotations

import csv
import os
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch.distributed as dist

import db
from db import elastic, store, system_metrics
from reports import run_csv, sweep_report
from trainer_backend.telemetry.machine_samples import StoreDrain, StorePusher, sample_store
from trainer_backend.telemetry.sampler import SystemSampler
from reports import series_charts
from tests.support import system_metric_rows

CONFIG = {"dataset": "digits", "model": "test_resnet", "strategy": "ddp", "devices": ["cpu", "cpu"], "batch_size": 64,
          "image_size": 16, "amp": "auto", "epochs": 1, "tags": []}


def machine_rows(node: int, times: list[float], *, gpus: list[float] = (), cpu: float = 50.0,
                 ranks: tuple[int, ...] = (0,)) -> list[dict]:
    """A sample of machine ``node`` at each time: host CPU ``cpu``, the ranks at 90 % each, GPUs at ``gpus`` %."""
    return [{"t_s": t, "node": node, "host_cpu_pct": cpu, "host_memory_mb": 1000.0 * (node + 1),
             "processes": [{"rank": rank, "cpu_pct": 90.0, "rss_mb": 500.0} for rank in ranks],
             "gpus": [{"index": i, "util_pct": util, "memory_used_mb": 100.0, "power_w": 200.0 + 100 * node,
                       "temperature_c": 60.0, "sm_clock_mhz": 1500.0} for i, util in enumerate(gpus)]}
            for t in times]


# --- the store between the machines ----------------------------------------------------------


def _proc_gone():
    raise OSError("/proc went away")


def test_another_machines_samples_reach_the_run_through_the_store_once_each_with_its_notes(engine, served):
    run_id = store.create_run(engine, CONFIG, status="running")
    started_at_s = time.time() - 100  # the run started training 100 s ago: remote t_s count from there
    drain = StoreDrain(sample_store(run_id, 0, host="127.0.0.1", port=served), {1: "node 1 (gpu-b)"}, started_at_s)
    lead = SystemSampler(engine, run_id, started_at_s, [], interval_s=0.05, flush_s=0.2, extra=drain)
    pusher = StorePusher(sample_store(run_id, 0, host="127.0.0.1", port=served), node=1)
    remote = SystemSampler(None, run_id, 0.0, [], interval_s=0.05, flush_s=0.2, node=1, machine="node 1 (gpu-b)",
                           sink=pusher)
    remote.watch({1: os.getpid()})
    lead.watch({0: os.getpid()})
    with lead:
        with remote:
            time.sleep(0.7)
            # Batches arrive while both sample, not only at the end.
            arrived = [r for r in system_metrics.read_samples(engine, [run_id]) if r["node"] == 1]
            assert arrived, "rank 0 took in no batch while sampling"
            remote.sample = _proc_gone  # the remote's sampler fails: its error comes through as a note
            time.sleep(0.2)
    elapsed_s = time.time() - started_at_s

    rows = system_metrics.read_samples(engine, [run_id])
    own, theirs = [r for r in rows if r["node"] == 0], [r for r in rows if r["node"] == 1]
    assert len(own) >= 8 and len(theirs) >= 8
    assert lead.written == len(rows) and remote.written == len(theirs)  # each batch written once
    assert all(100 <= r["t_s"] <= elapsed_s for r in theirs), theirs  # wall time made the run's time
    assert {tuple(p["rank"] for p in r["processes"]) for r in theirs} == {(1,)}
    raw = dist.TCPStore("127.0.0.1", served, is_master=False, timeout=timedelta(seconds=5))
    keys = dist.PrefixStore(f"parallax/samples/run-{run_id}/attempt-0/", raw)
    pushed = keys.add("node-1/count", 0)
    assert pushed >= 3 and not any(keys.check([f"node-1/{seq}"]) for seq in range(pushed))  # read, then deleted
    assert keys.add("node-1/done", 0) == 1
    assert store.get_run(engine, run_id).notes == ["System sampling of node 1 (gpu-b) stopped early: OSError: /proc "
                                                   "went away"]


def test_rank_0_waits_a_bounded_time_for_a_machine_that_never_finishes_and_names_it(engine, served):
    run_id = store.create_run(engine, CONFIG, status="running")
    # Node 1 finishes; node 2 samples, then its machine dies; node 3's sampler never starts.
    machines = {1: "node 1 (gpu-b)", 2: "node 2 (gpu-c)", 3: "node 3 (gpu-d)"}
    drain = StoreDrain(sample_store(run_id, 0, host="127.0.0.1", port=served), machines, time.time(),
                       done_wait_s=0.5)
    finished = StorePusher(sample_store(run_id, 0, host="127.0.0.1", port=served), node=1)
    assert finished.write(machine_rows(1, [time.time()]))
    finished.close([])
    silent = StorePusher(sample_store(run_id, 0, host="127.0.0.1", port=served), node=2)
    assert silent.write(machine_rows(2, [time.time()]))

    lead = SystemSampler(engine, run_id, time.time(), [], interval_s=10, extra=drain)
    lead.start()
    started = time.monotonic()
    lead.stop()
    assert time.monotonic() - started < 3
    assert sorted(r["node"] for r in system_metrics.read_samples(engine, [run_id])) == [1, 2]
    assert store.get_run(engine, run_id).notes == [
        "The last system samples of node 2 (gpu-c) are missing: its sampler had not said it finished 0.5 s after "
        "rank 0's (it failed, could not reach torchrun's store, or its machine or connection failed).",
        "No system samples of node 3 (gpu-d) reached rank 0: its sampler had not said it finished 0.5 s after "
        "rank 0's (it failed, could not reach torchrun's store, or its machine or connection failed)."]


def test_an_attempt_never_takes_in_the_samples_an_earlier_attempt_left_in_the_store(served):
    """The agent's store outlives a restart: the new attempt's keys are its own, so what the last
    attempt pushed (its count, its done mark, a batch never read) is neither read nor awaited."""
    earlier = StorePusher(sample_store(7, "first-attempt", host="127.0.0.1", port=served), node=1)
    assert earlier.write(machine_rows(1, [time.time()]))
    earlier.close([])
    drain = StoreDrain(sample_store(7, "second-attempt", host="127.0.0.1", port=served), {1: "node 1 (gpu-b)"},
                       time.time(), done_wait_s=0.3)
    assert drain.rows() == []
    now = StorePusher(sample_store(7, "second-attempt", host="127.0.0.1", port=served), node=1)
    assert now.write(machine_rows(1, [time.time()])) and now.write(machine_rows(1, [time.time()]))
    assert [row["node"] for row in drain.rows()] == [1, 1]
    started = time.monotonic()
    assert drain.finish() == [] and time.monotonic() - started >= 0.3  # this attempt's machine has not finished
    assert drain.notes()[0].startswith("The last system samples of node 1 (gpu-b) are missing")


def test_a_machine_that_cannot_reach_rank_0_counts_its_samples_as_dropped():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    pusher = StorePusher(sample_store(1, 0, host="127.0.0.1", port=server.port, timeout_s=1), node=1)
    sampler = SystemSampler(None, 1, 0.0, [], interval_s=10, node=1, machine="node 1 (gpu-b)", sink=pusher)
    sampler._rows = machine_rows(1, [1.0, 2.0])
    del server  # rank 0's store is gone
    sampler._flush()
    assert sampler.dropped == 2 and sampler.written == 0
    (note,) = sampler.notes()
    assert note.startswith("2 system samples of node 1 (gpu-b) were not recorded: rank 0 could not be reached "
                           "through torchrun's store (")


# --- reads, export, charts and reports ---------------------------------------------------


def test_reads_thin_each_machines_samples_on_its_own(backend_db_url):
    engine = db.make_engine(backend_db_url)
    run_id = store.create_run(engine, CONFIG)
    # Node 0 every second, node 1 every second too but 0.4 s later, and a third of the samples.
    system_metrics.add_samples(engine, run_id, machine_rows(0, [float(t) for t in range(600)]))
    system_metrics.add_samples(engine, run_id, machine_rows(1, [t + 0.4 for t in range(0, 600, 3)], ranks=(1,)))
    thinned = system_metrics.read_metric(engine, [run_id], [("process", "cpu_pct")], max_points=40)
    by_node = {node: [r for r in thinned if r["node"] == node] for node in (0, 1)}
    assert 5 <= len(by_node[0]) <= 40 and 5 <= len(by_node[1]) <= 40  # both machines in every span
    assert all(r["device"] == r["node"] for r in thinned)  # each machine's own rank
    assert sum(r["n"] for r in by_node[0]) == 600 and sum(r["n"] for r in by_node[1]) == 200
    assert len(system_metrics.read_samples(engine, [run_id])) == 800
    db.dispose_engines()


def test_export_and_csv_name_the_machine_of_each_sample(engine, tmp_path):
    run_id = store.create_run(engine, CONFIG, status="completed")
    elastic.record_job(engine, run_id, elastic_run_id="job", nodes=2, hosts=["gpu-a", "gpu-b"])
    system_metrics.add_samples(engine, run_id, machine_rows(0, [1.0]) + machine_rows(1, [1.2], ranks=(1,)))
    exported = store.export_run(engine, run_id)
    assert [(s["t_s"], s["host"], s["node"]) for s in exported["system"]] == [(1.0, "gpu-a", 0), (1.2, "gpu-b", 1)]
    assert list(exported["system"][0]) == ["t_s", "host", "node", "host_cpu_pct", "host_memory_mb", "processes", "gpus"]
    run_csv.write_run_csv(exported, tmp_path)
    with open(tmp_path / "system.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["host"], row["node"], row["rank0_cpu_pct"], row["rank1_cpu_pct"]) for row in rows] == [
        ("gpu-a", "0", "90.0", ""), ("gpu-b", "1", "", "90.0")]


def test_charts_name_hosts_and_gpus_by_machine_only_where_a_run_has_several():
    rows = system_metric_rows([{"run_id": 1, **row}
                               for row in machine_rows(0, [0.0], gpus=[50]) + machine_rows(1, [0.1], gpus=[60], ranks=(1,))])
    named = series_charts.system_frame(rows, {1: ["gpu-a", "gpu-b"]})
    assert list(dict.fromkeys(named["device"])) == ["host gpu-a", "rank 0", "GPU 0 on gpu-a",
                                                    "host gpu-b", "rank 1", "GPU 0 on gpu-b"]
    # Machines that share a name (two agents on one machine) are told apart by node.
    shared = series_charts.system_frame(rows, {1: ["vm", "vm"]})
    assert list(dict.fromkeys(shared["device"])) == ["node 0 (vm)", "rank 0", "GPU 0 on node 0 (vm)",
                                                     "node 1 (vm)", "rank 1", "GPU 0 on node 1 (vm)"]
    # Without the run's hosts, the nodes in the samples still tell the machines apart.
    assert "GPU 0 on node 1" in set(series_charts.system_frame(rows)["device"])
    figure = series_charts.system_figure(shared, "util_pct")
    assert [trace.name for trace in figure.data] == ["GPU 0 on node 0 (vm)", "GPU 0 on node 1 (vm)"]
    # One machine: exactly as before.
    single = series_charts.system_frame([row for row in rows if row["node"] == 0], {1: []})
    assert single["device"].tolist() == ["host", "rank 0", "GPU 0"]


def test_compare_sums_and_averages_across_machines_sampled_at_different_moments():
    # Node 0: ranks 0 and 1, two GPUs at 80 %, a sample a second. Node 1: rank 2, one GPU at 20 %,
    # sampled 0.4 s later each second, and silent from t=6 on (it stopped: those moments are left out).
    rows = (machine_rows(0, [float(t) for t in range(10)], gpus=[80, 80], cpu=40, ranks=(0, 1))
            + machine_rows(1, [t + 0.4 for t in range(6)], gpus=[20], cpu=80, ranks=(2,)))
    system = series_charts.system_frame(system_metric_rows([{"run_id": 1, **row} for row in rows]), {1: ["a", "b"]})
    steps = series_charts.steps_frame([])
    cpu = series_charts.compare_frame(steps, system, "process_cpu_pct")
    assert cpu["t_s"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # 6.0: node 1's 5.4 is near enough
    assert cpu["value"].tolist() == [270.0] * 7  # three ranks at 90 %, on two machines
    util = series_charts.compare_frame(steps, system, "gpu_util_pct")
    assert util["value"].tolist() == pytest.approx([60.0] * 7)  # the mean over the three GPUs, not of the machines
    power = series_charts.compare_frame(steps, system, "gpu_power_w")
    assert power["value"].tolist() == [2 * 200.0 + 300.0] * 7
    host = series_charts.compare_frame(steps, system, "host_cpu_pct")
    assert host["value"].tolist() == [60.0] * 7  # the mean of the hosts: 40 % and 80 % of their cores


def test_the_sweep_report_weighs_each_machines_gpus_over_its_own_samples(engine):
    first, second = store.create_run(engine, CONFIG), store.create_run(engine, CONFIG)
    system_metrics.add_samples(engine, first, machine_rows(0, [float(t) for t in range(10)], gpus=[80, 80], cpu=40)
                               + machine_rows(1, [0.4, 1.4], gpus=[20], cpu=80))
    system_metrics.add_samples(engine, second, machine_rows(0, [0.0, 1.0], cpu=30) + machine_rows(1, [0.5], cpu=70))
    means = sweep_report.mean_utilisation(
        system_metrics.metric_totals(engine, [first, second], sweep_report.UTILISATION_METRICS))
    # Three GPUs, two at 80 % and one at 20 %, whichever machine was sampled more often.
    assert means[first] == (pytest.approx(60.0), "GPU")
    assert means[second] == (pytest.approx(50.0), "CPU")  # the machines' means, 30 % and 70 %


def test_each_machine_samples_its_own_ranks_and_gpus():
    from trainer_backend.supervisor.torchrun import Member, Sampling

    # Two machines of two GPUs each; rank 0 is on node 0.
    members = [Member("a", 0, "cuda:0", 1, 100), Member("a", 0, "cuda:1", 1, 101),
               Member("b", 1, "cuda:0", 2, 200), Member("b", 1, "cuda:1", 2, 201)]
    joined = SimpleNamespace(devices=[m.device for m in members])  # a RunConfig checks GPUs exist here
    lead, other = Sampling(0, members), Sampling(1, members)
    assert (lead.neighbours, lead.remote, lead.machine()) == ({0: 100, 1: 101}, False, "node 0 (a)")
    assert (other.neighbours, other.remote, other.machine()) == ({2: 200, 3: 201}, True, "node 1 (b)")
    assert lead.cuda_indices(joined) == other.cuda_indices(joined) == [0, 1]
    assert Sampling(0, members[:2]).machine() is None  # one machine: its notes read as a spawned run's

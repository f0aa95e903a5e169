"""The CPU cores a Slurm job's ranks get, on a real two-node cluster that binds each task to the cores it was
given (tests/slurm_cluster.py with ``task/affinity``, each node declaring this machine's own cores): the job
asks for what the run needs and passes it to srun, which since Slurm 22.05 does not inherit it from sbatch.

    .venv/bin/python -m pytest tests/trainer_backend/control/test_slurm_cpus.py -q
"""

from __future__ import annotations

import json
import os
import time

import pytest

from db import make_engine, store
from tests.slurm_cluster import SlurmCluster, unavailable_reason
from tests.support import run_cli
from trainer_backend.control import slurm_status
from trainer_backend.control.slurm_status import watch_slurm_runs

pytestmark = pytest.mark.processes

RUN_WITHIN_S = 300.0  # a job's processes import torch and timm on a shared 2-core machine


@pytest.fixture(scope="module")
def binding_cluster(tmp_path_factory):
    """Two nodes of this machine's two cores each, whose tasks are bound to the cores Slurm gives them."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to tell one core from two")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm-binding"), cpus_per_node=2, binds_cores=True).start()
    try:
        yield cluster
    finally:
        cluster.cancel_all()
        cluster.stop()


def test_each_rank_of_a_two_node_job_runs_on_the_cores_the_job_asked_for(binding_cluster, parallax_home, tmp_path,
                                                                          monkeypatch):
    """One process a node with one loader worker: the job asks for 1 x (1 + 1) = 2 cores a node, and each rank
    may run on both (a step without --cpus-per-task would be bound to one)."""
    monkeypatch.setenv("SLURM_CONF", str(binding_cluster.conf))
    slurm_status.forget_queue()
    reports = tmp_path / "affinity"
    reports.mkdir()
    env = {"PARALLAX_PLUGINS": "tests.plugins.affinity_model", "PARALLAX_TEST_AFFINITY_DIR": str(reports),
           "SLURM_CONF": str(binding_cluster.conf)}
    launched = run_cli("launch", "--where", "slurm", "--strategy", "ddp", "--devices", "cpu,cpu", "--slurm-nodes", "2",
                       "--num-workers", "1", "--dataset", "digits", "--model", "parallax_reports_affinity",
                       "--image-size", "16", "--epochs", "1", "--batch-size", "64", home=parallax_home, env_extra=env,
                       timeout=120)
    assert launched.returncode == 0, launched.stderr
    run_id = int(dict(part.split("=", 1) for part in launched.stdout.split())["run_id"])
    engine = make_engine(f"sqlite:///{parallax_home / 'parallax.db'}")
    deadline = time.monotonic() + RUN_WITHIN_S
    while time.monotonic() < deadline:
        watch_slurm_runs(engine, interval_s=1.0)
        run = store.get_run(engine, run_id)
        if run.status not in ("queued", "running"):
            break
        time.sleep(1)
    assert run.status == "completed", run.error
    seen = {path.stem: json.loads(path.read_text()) for path in reports.glob("rank*.json")}
    assert set(seen) == {"rank0", "rank1"} and {report["node"] for report in seen.values()} == {"n1", "n2"}, seen
    assert all(len(report["cores"]) == 2 for report in seen.values()), seen

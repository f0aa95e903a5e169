"""The test cluster itself: two nodes that take a two-node job (what every other Slurm test stands on)."""

from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.processes


def test_a_two_node_job_runs_one_task_on_each_node(slurm_cluster, tmp_path):
    out = tmp_path / "out.txt"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsrun bash -c 'echo $SLURMD_NODENAME'\n")
    submitted = subprocess.run(["sbatch", "--parsable", "--wait", "-N2", "-o", str(out), str(script)],
                               env=slurm_cluster.env, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    assert sorted(out.read_text().split()) == ["n1", "n2"]

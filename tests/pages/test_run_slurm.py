"""The Run and Runs pages of a run sent to Slurm: its job and PENDING's reason from the shared poll, the sbatch script kept
with the run, and the job's output file (there from submission), on a real test cluster."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from contract.config import RunConfig
from trainer_backend.control import slurm_status
from trainer_backend.control.slurm_job import submit_array
from tests.support import ROOT

pytestmark = pytest.mark.processes


def test_the_run_page_shows_the_pending_reason_the_script_and_the_output(slurm_cluster, parallax_home, engine,
                                                                        monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    config = RunConfig(dataset="digits", model="test_resnet", image_size=16, where="slurm", strategy="ddp",
                       batch_size=64, slurm_extra=("--begin=now+1hour",))
    try:
        run_id = submit_array([config])[0]
        slurm_status.forget_queue()
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90)
        at.query_params["run"] = str(run_id)
        at.switch_page("pages/run.py").run()
        assert not at.exception, at.exception
        captions = " ".join(c.value for c in at.caption)
        assert "PENDING (BeginTime)" in captions, captions
        codes = [c.value for c in at.code]
        assert any(f"#SBATCH --job-name=parallax-{run_id}" in code for code in codes)
        assert any("the job has not started" in code for code in codes)
        runs = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90)
        runs.switch_page("pages/runs.py").run()
        assert not runs.exception, runs.exception
        table = runs.dataframe[0].value
        assert list(table.loc[table["run"] == run_id, "status"]) == ["queued · PENDING (BeginTime)"]
    finally:
        slurm_cluster.cancel_all()

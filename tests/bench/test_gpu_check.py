"""``make gpu-check`` (bench/gpu_check.py) where this machine can show it: the one line and exit 0
without CUDA, the same through make with no virtual environment, and its runs, figures and
docs section on real CPU runs (on a GPU machine ``make gpu-check`` itself runs them on cuda:0).
The two tests that train run with the benchmark scripts, in ``make bench-check``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench import gpu_check
from tests.support import ROOT
from trainer_backend.telemetry.flops import MEASURED_ON_CPU

NO_CUDA = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # as on a machine without a GPU, even on one with


def test_without_cuda_it_says_so_in_one_line_and_exits_0(tmp_path):
    docs = tmp_path / "BENCHMARKS.md"
    done = subprocess.run([sys.executable, "bench/gpu_check.py", "--docs", str(docs)], cwd=ROOT, env=NO_CUDA,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["gpu-check: no CUDA device on this machine (torch.cuda.is_available() is "
                                        "False): nothing to check"]
    assert not docs.exists()


def test_make_gpu_check_runs_with_the_python_it_is_given_and_no_virtual_environment(tmp_path):
    """Where PyTorch is preinstalled and the rest comes as wheels on PYTHONPATH there is no .venv."""
    done = subprocess.run(["make", "-s", "gpu-check", f"PY={sys.executable}", f"VENV={tmp_path / 'no-venv'}"],
                          cwd=ROOT, env=NO_CUDA, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(done.stdout.splitlines()) == 1 and "no CUDA device" in done.stdout
    assert not (tmp_path / "no-venv").exists()  # nothing was installed


# Real engine runs of a benchmark script: with the benchmarks' own runs in make bench-check (CI runs it
# after make test), not in make test.
@pytest.mark.bench
@pytest.mark.processes
def test_its_runs_figures_and_docs_section_on_real_cpu_runs(parallax_home, db_url, monkeypatch):
    monkeypatch.setattr(gpu_check, "WORKLOAD", ("--dataset", "digits", "--model", "test_resnet", "--image-size", "16",
                                                "--batch-size", "128", "--epochs", "1", "--quiet"))
    monkeypatch.setenv("PARALLAX_DB_URL", db_url)  # as main() sets it, for torchrun's processes
    single = gpu_check.run_one("single", ("--strategy", "single", "--devices", "cpu"), db_url, timeout_s=300)
    torchrun = gpu_check.run_one("torchrun --standalone, ddp", ("--strategy", "ddp", "--devices", "cpu"), db_url,
                                 timeout_s=300)
    for result in (single, torchrun):
        assert result["status"] == "completed", result
        assert len(result["epoch_images_per_s"]) == 1 and result["epoch_images_per_s"][0] > 0
        assert result["max_step_images_per_s"] > 0 and result["max_step_over_epoch"] > 0
        assert result["peak_memory_mb"] > 0 and 0 < result["mfu"] <= 1
        # On a GPU run a CPU peak would be a defect, and the check says so.
        assert result["peak_source"] == MEASURED_ON_CPU and any("CPU peak" in p for p in result["problems"])

    section = gpu_check.section("NVIDIA Example 80GB", "1 GPU(s) visible", [single, torchrun], {"summary": "3 passed"})
    assert "**NVIDIA Example 80GB**" in section and "| single |" in section and "3 passed" in section
    docs = parallax_home / "BENCHMARKS.md"
    docs.write_text("# Benchmarks\n\n## 1. Engine overhead\n")
    gpu_check.write_section(docs, section)
    gpu_check.write_section(docs, section.replace("3 passed", "4 passed"))  # a second check replaces the first
    text = docs.read_text()
    assert text.count(gpu_check.BEGIN) == 1 and "4 passed" in text and text.startswith("# Benchmarks\n\n## 1.")
    # make bench rewrites the file from its results: the section stays.
    rendered = gpu_check.keep_section(text, "# Benchmarks\n\n## 1. Engine overhead (new)\n")
    assert "(new)" in rendered and rendered.count(gpu_check.BEGIN) == 1 and "4 passed" in rendered


@pytest.mark.parametrize("bad, problem", [({"images_per_s": 1800.0}, "a step point at 9.0x"),
                                         ({"mfu": 1.4}, "MFU 1.4"), ({}, None)])
def test_a_figure_out_of_bounds_is_a_problem(bad, problem):
    """Epoch 1 (cuDNN's search in its first step) is slow: later points are measured against the best epoch."""
    run = {"status": "completed", "measurements": {"peak_tflops": 989.5, "peak_source": "H100 bf16 (NVIDIA datasheet)"},
           "epochs": [{"epoch": e, "images_per_s": rate, "peak_memory_mb": {"cuda:0": 10.0},
                       "extra": {"mfu": bad.get("mfu", 0.3)}} for e, rate in ((1, 50.0), (2, 200.0))],
           "steps": [{"epoch": 1, "images_per_s": bad.get("images_per_s", 210.0)}, {"epoch": 2, "images_per_s": 190.0}]}
    summary = gpu_check.summarise("single bf16", (), run, wall_s=1.0)
    if problem is None:
        assert summary["problems"] == [] and summary["max_step_over_epoch"] == 1.05
    else:
        assert summary["problems"] and summary["problems"][0].startswith(problem)


@pytest.mark.bench  # a real engine run, as the test above
@pytest.mark.processes
def test_the_whole_check_on_a_machine_that_says_it_has_cuda(parallax_home, monkeypatch, capsys):
    """main() as on a GPU machine (torch.cuda faked in this process only; the run itself trains on the
    CPU): the run's line is printed, the section names the GPU, and a CPU peak fails the check."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Example 80GB")
    monkeypatch.setattr(gpu_check, "WORKLOAD", ("--dataset", "digits", "--model", "test_resnet", "--image-size", "16",
                                                "--batch-size", "128", "--epochs", "1", "--quiet"))
    monkeypatch.setattr(gpu_check, "RUNS", [("single on the CPU", ("--strategy", "single", "--devices", "cpu"))])
    docs = parallax_home / "BENCHMARKS.md"
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--no-tests", "--docs", str(docs)])
    assert gpu_check.main() == 1
    out = capsys.readouterr().out
    assert out.startswith("gpu-check on NVIDIA Example 80GB (1 GPU(s) visible") and "| single on the CPU |" in out
    text = docs.read_text()
    assert "**NVIDIA Example 80GB**" in text and "a CPU peak on a GPU run" in text and "test_gpu.py" not in text

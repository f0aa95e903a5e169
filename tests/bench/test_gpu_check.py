"""``make gpu-check`` (bench/gpu_check.py) where this machine can show it: the one line and exit 0
without CUDA, the same through make with no virtual environment, and its runs, figures and
docs section on real CPU runs (on a GPU machine ``make gpu-check`` itself runs them on cuda:0).
The two tests that train run with the benchmark scripts, in ``make bench-check``."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys

import pytest
from PIL import Image

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
    docs.write_text("# Benchmarks\n\n## 1. Parallax overhead\n")
    gpu_check.write_section(docs, section)
    gpu_check.write_section(docs, section.replace("3 passed", "4 passed"))  # a second check replaces the first
    text = docs.read_text()
    assert text.count(gpu_check.BEGIN) == 1 and "4 passed" in text and text.startswith("# Benchmarks\n\n## 1.")
    # make bench rewrites the file from its results: the section stays.
    rendered = gpu_check.keep_section(text, "# Benchmarks\n\n## 1. Parallax overhead (new)\n")
    assert "(new)" in rendered and rendered.count(gpu_check.BEGIN) == 1 and "4 passed" in rendered


def tiny_check(monkeypatch):
    """gpu-check's comparisons at sizes two CPU cores train in seconds, on the CPU."""
    monkeypatch.setattr(gpu_check, "DEVICE", "cpu")
    monkeypatch.setattr(gpu_check, "PAIRS", 1)  # the GPU's two would double the time, not what is checked
    monkeypatch.setattr(gpu_check, "COMPARE", {"dataset": "digits", "model": "test_resnet", "epochs": 2,
                                               "batch_size": 128, "image_size": 16})
    monkeypatch.setattr(gpu_check, "JPEG_PER_CLASS", 6)
    monkeypatch.setattr(gpu_check, "JPEG_SIZES", (20, 48))
    monkeypatch.setattr(gpu_check, "JPEG_FLAGS", ("--model", "test_resnet", "--image-size", "16", "--batch-size", "8",
                                                  "--epochs", "2", "--seed", "0", "--bn-stats-images", "0",
                                                  "--num-workers", "1", "--quiet"))


@pytest.mark.bench
@pytest.mark.processes
def test_parallax_against_the_hand_written_loop_on_both_data_paths_on_the_cpu(parallax_home, db_url, monkeypatch):
    """The comparison gpu-check makes on a GPU, made on the CPU: both loops train, each pair's
    ratio is Parallax's images/s over the hand loop's, and the sync counts are None (no CUDA)."""
    tiny_check(monkeypatch)
    paths = gpu_check.compare_with_hand_loop(db_url)
    assert set(paths) == {"device", "host"}
    for result in paths.values():
        assert len(result["parallax"]) == len(result["plain"]) == len(result["ratios"]) == gpu_check.PAIRS
        assert all(v > 0 for v in result["parallax"] + result["plain"])
        assert result["ratios"] == [e / p for e, p in zip(result["parallax"], result["plain"])]
        assert result["parallax_syncs_per_step"] is None and result["plain_syncs_per_step"] is None
        below = statistics.median(result["ratios"]) < gpu_check.TARGET_RATIO
        assert bool(result["problems"]) == below
    rows = gpu_check.paths_table(paths)
    assert len(rows) == 4 and "host path: loader workers" in rows[3]


def test_the_sync_counter_counts_what_set_sync_debug_mode_warns_of(monkeypatch):
    """The counting, with the CUDA edge faked: torch warns once per synchronising call."""
    import warnings

    import torch

    from bench.gpu import SyncCounter

    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    with SyncCounter(torch.device("cuda:0")) as counter:
        for _ in range(3):
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=2)
        warnings.warn("something else", UserWarning, stacklevel=2)
    assert counter.count == 3 and modes == ["warn", "default"]
    with SyncCounter(torch.device("cpu")) as counter:
        pass
    assert counter.count is None and modes == ["warn", "default"]  # a CPU leaves the mode alone


@pytest.mark.bench  # a Parallax run's two epochs in this process
def test_parallaxs_sync_audit_runs_with_the_guard_the_step_hooks_and_the_stop_check():
    """The epoch whose synchronising calls gpu-check counts is a run's: the NaN guard, the step hooks (step points
    written) and the stop check each step, as the trainer wires them (on the CPU the count itself is None)."""
    from bench.gpu import parallax_sync_audit

    audit = parallax_sync_audit("test_resnet", 128, 16, device="cpu", data_path="device")
    assert audit["syncs_per_step"] is None and audit["steps"] == 12
    assert audit["step_points"] == 2 * audit["steps"] and audit["stop_checks"] == 2 * audit["steps"], audit


@pytest.mark.bench
@pytest.mark.processes
def test_a_jpeg_folder_of_mixed_sizes_decoded_in_the_workers_and_from_the_cache(parallax_home, db_url, monkeypatch):
    tiny_check(monkeypatch)
    monkeypatch.setenv("PARALLAX_DB_URL", db_url)
    folder = gpu_check.write_jpeg_folder(parallax_home / "jpeg")
    sizes = {Image.open(path).size for path in folder.rglob("*.jpg")}
    assert len(sizes) > 12  # nearly one shape per image
    result = gpu_check.jpeg_losses(folder, db_url, timeout_s=300)
    assert len(result["losses"]["workers"]) == len(result["losses"]["cache"]) == 2, result
    assert result["gap"] is not None and result["gap"] < gpu_check.MAX_LOSS_GAP and result["problems"] == [], result


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
    monkeypatch.setattr(gpu_check, "RUNS", [("single on the CPU", ("--strategy", "single", "--devices", "cpu",
                                                                 "--stored-size", "20")),
                                            ("single --amp off", ("--strategy", "single", "--devices", "cpu",
                                                                  "--amp", "off"))])
    tiny_check(monkeypatch)
    monkeypatch.setattr(gpu_check, "TORCHRUN_PAIR", [(name, ("--strategy", "ddp", "--devices", "cpu"), agent)
                                                     for name, _, agent in gpu_check.TORCHRUN_PAIR])
    checked = []
    monkeypatch.setattr(gpu_check.gpu_run_checks, "run_checks", lambda run_one, home, db_url, timeout_s, device: (
        checked.append(device) or [gpu_check.gpu_run_checks.row("NaN at step 30, stand-in", "as asked", [])]))
    docs = parallax_home / "BENCHMARKS.md"
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--no-tests", "--docs", str(docs)])
    assert gpu_check.main() == 1
    out = capsys.readouterr().out
    assert out.startswith("gpu-check on NVIDIA Example 80GB (1 GPU(s) visible") and "| single on the CPU |" in out
    text = docs.read_text()
    assert "**NVIDIA Example 80GB**" in text and "a CPU peak on a GPU run" in text and "test_gpu.py" not in text
    # The comparison with the hand-written loop, the JPEG losses, the estimate and --amp off's epochs.
    assert "Parallax against a hand-written loop" in text and "| dataset kept on the GPU |" in text
    assert "host path: loader workers, pinned non-blocking copies |" in text and "from the cache" in text
    assert "| single on the CPU |" in text.split("The memory estimate")[1]
    # Right after the pairs: the torchrun jobs with and without the stop check, then the other checks.
    assert checked == ["cpu"] and "| torchrun --standalone --max-restarts 1, ddp (stop check) |" in text
    assert "| stop check (torchrun --max-restarts 1 against none) |" in text and "| NaN at step 30, stand-in |" in text
    assert re.search(r"single --amp off: the allocator's peak per epoch .* the peak is in epoch [12]\.", text)


def test_the_stop_checks_cost_is_judged_against_the_pairs_spread():
    from bench.gpu_run_checks import stop_check_cost

    without, with_check = {"status": "completed", "epoch_images_per_s": [900.0, 1000.0]}, \
        {"status": "completed", "epoch_images_per_s": [880.0, 960.0]}
    assert stop_check_cost(without, with_check, [0.97, 1.02])["problems"] == []  # 0.96, within a spread of 0.05
    judged = stop_check_cost(without, with_check, [0.99, 1.01])
    assert judged["ratio"] == pytest.approx(0.96) and "beyond the pairs' spread 0.020" in judged["problems"][0]


@pytest.mark.bench
@pytest.mark.processes
def test_what_a_run_does_besides_its_steps_checked_on_the_cpu(parallax_home, db_url, monkeypatch):
    """gpu-check's checks after its pairs (bench/gpu_run_checks.py), on the CPU: a job stopped at a step resumes
    over gloo; NaN stops and skips, single and torchrun; the SDK script profiles and logs; SIGTERM during a long
    matrix product ends the process within the grace, rank 0 recording from the grace's thread."""
    from bench import gpu_run_checks

    monkeypatch.setenv("PARALLAX_DB_URL", db_url)  # as main() sets it, for torchrun's processes
    rows = gpu_run_checks.run_checks(gpu_check.run_one, parallax_home, db_url, 300, "cpu")
    assert [r["name"] for r in rows] == [
        "stop at a step and resume over gloo",
        *(f"NaN at step 30, --on-nonfinite {action}, {how}" for how in ("single", "torchrun DDP")
          for action in ("stop", "skip")),
        "SDK: profile and log on one visible GPU, LOCAL_RANK=3",
        "SIGTERM during a long CPU matrix product, rank 0", "SIGTERM during a long CPU matrix product, another rank"]
    assert all(r["problems"] == [] for r in rows), rows

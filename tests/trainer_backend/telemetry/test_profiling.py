"""Profiling every strategy on CPU: the op table, step breakdown and traces land in SQLite,
and the CLI exports traces that multi-rank tools can read, a CSV and an offline HTML report."""

from __future__ import annotations

import csv
import gzip
import json
import os

import pytest

from tests.support import run_cli
from db import make_engine, profiles


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


STRATEGIES = {
    "single": ("--strategy", "single", "--devices", "cpu"),
    "ddp": ("--strategy", "ddp", "--devices", "cpu,cpu"),
    "mp": ("--strategy", "mp", "--devices", "cpu,cpu"),
}


@pytest.fixture(scope="module")
def profiled_output(home):
    """Each strategy's run id and what its processes printed (what a launched run's log holds)."""
    runs = {}
    for name, flags in STRATEGIES.items():
        # One epoch of 12 steps holds the whole window (wait 1, warmup 1, active 2).
        result = run_cli("run", "--model", "test_resnet", "--image-size", "16", "--epochs", "1", "--profile", "--profile-active", "2",
                         *flags, home=home)
        assert result.returncode == 0, result.stdout + result.stderr
        runs[name] = (int(result.stdout.strip().splitlines()[-1].split()[0].split("=")[1]), result.stdout + result.stderr)
    return runs


@pytest.fixture(scope="module")
def profiled(profiled_output):
    return {name: run_id for name, (run_id, _) in profiled_output.items()}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_profiled_cpu_run_logs_no_error_line(profiled_output, strategy):
    """An ERROR line in a log means an error: torch's harmless profiler lines on CPU are left out,
    and the log says so."""
    _, output = profiled_output[strategy]
    assert not [line for line in output.splitlines() if "ERROR" in line], output
    assert "Memory block of unknown size was allocated" not in output
    assert "gpuGetDeviceCount failed with code" not in output
    assert "'Memory block of unknown size' warning and Kineto's 'gpuGetDeviceCount failed' line" in output


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_each_strategy_stores_ops_breakdown_and_traces(home, profiled, strategy):
    engine = make_engine(f"sqlite:///{home / 'parallax.db'}")
    run_id = profiled[strategy]
    ranks = [0, 1] if strategy == "ddp" else [0]
    ops = profiles.read_ops(engine, run_id)
    assert {op["rank"] for op in ops} == set(ranks)
    assert any(op["name"] == "aten::convolution_backward" and op["calls"] > 0 for op in ops)
    steps = profiles.read_steps(engine, [run_id])
    # wait 1, warmup 1, active 2: training steps 3 and 4 are kept, on every rank.
    assert sorted((s["rank"], s["step"]) for s in steps) == [(r, n) for r in ranks for n in (3, 4)]
    for step in steps:
        phases = step["data_loading_ms"] + step["forward_ms"] + step["backward_ms"] + step["optimizer_step_ms"]
        assert step["forward_ms"] > 0 and step["backward_ms"] > 0 and step["optimizer_step_ms"] > 0
        assert phases + step["other_ms"] == pytest.approx(step["total_ms"], rel=1e-6)
        assert (step["communication_ms"] > 0) == (strategy == "ddp")
    assert [t["rank"] for t in profiles.list_traces(engine, run_id)] == ranks


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_cli_exports_traces_csv_and_an_offline_report(home, profiled, strategy, tmp_path):
    run_id = profiled[strategy]
    out = tmp_path / "profile"
    result = run_cli("export", str(run_id), "--profile-dir", str(out), home=home)
    assert result.returncode == 0, result.stderr
    world = 2 if strategy == "ddp" else 1
    for rank in range(world):
        trace = json.loads(gzip.decompress((out / f"parallax-run-{run_id}-trace-rank{rank}.json.gz").read_bytes()))
        assert trace["traceEvents"]
        assert any(e.get("name", "").startswith("ProfilerStep") for e in trace["traceEvents"])
        assert trace["distributedInfo"]["rank"] == rank and trace["distributedInfo"]["world_size"] == world
    rows = list(csv.DictReader((out / "ops.csv").open()))
    assert rows and {"rank", "name", "calls", "self_cpu_us", "self_device_us"} <= set(rows[0])
    report = (out / "report.html").read_text()
    assert f"Profile of run {run_id}" in report and "Mean time per training step" in report
    assert "<script" in report and "<script src=" not in report  # plotly.js inline: opens offline


def test_profiling_is_noted_on_the_run(home, profiled):
    run = json.loads(run_cli("export", str(profiled["single"]), home=home).stdout)
    assert any("Epoch 1 was profiled (steps 3-4)" in note for note in run["notes"])


def test_export_of_an_unprofiled_run_says_how_to_profile(shared_runs, tmp_path):
    run_id = str(shared_runs["ddp_tiny"]["run_id"])
    result = run_cli("export", run_id, "--profile-dir", str(tmp_path / "p"), home=shared_runs.home)
    assert result.returncode == 2 and "has no profile" in result.stderr and "--profile" in result.stderr


# --- the step breakdown from the profiler's events, as a CUDA run lists them ---------------


def event(name: str, start_us: float, end_us: float, *, device: bool = False):
    """A profiler event as ``prof.events()`` holds it: host-side, or a copy/kernel on GPU 0."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    return FunctionEvent(id=0, name=name, thread=7 if device else 1, start_us=start_us, end_us=end_us,
                         device_type=DeviceType.CUDA if device else DeviceType.CPU, device_index=0)


def cuda_step(start: float, *, comm: str | None = "ncclDevKernel_AllReduce_Sum_f32_RING_LL") -> list:
    """One 100 µs step: host ranges, their device-side copies with the same names (how kineto
    lists user annotations on the GPU), kernels, and an optional collective during backward."""
    ranges = [("ProfilerStep#3", 0, 100), ("parallax/data_loading", 0, 10), ("parallax/forward", 10, 40),
              ("parallax/backward", 40, 80), ("parallax/optimizer_step", 80, 95)]
    events = [event(name, start + a, start + b) for name, a, b in ranges]
    events += [event(name, start + a + 1, start + b, device=True) for name, a, b in ranges]
    events += [event("aten::gather", start + 20, start + 30), event("GatherBackward0", start + 50, start + 55),
               event("void at::native::gather_kernel", start + 21, start + 29, device=True),
               event("ampere_sgemm_64x32", start + 12, start + 38, device=True)]
    if comm:
        events += [event("nccl:all_reduce", start + 60, start + 61),  # the host only enqueues it
                   event(comm, start + 60, start + 78, device=True)]
    return events


def test_cuda_steps_and_phases_are_counted_once_from_the_host_ranges():
    from trainer_backend.telemetry.profiling import step_breakdown

    rows = step_breakdown(cuda_step(1000) + cuda_step(1200), first_step=3)
    assert [r["step"] for r in rows] == [3, 4]  # not 4 rows: the device-side ProfilerStep copies are not steps
    for row in rows:
        assert (row["data_loading_ms"], row["forward_ms"], row["backward_ms"], row["optimizer_step_ms"]) == \
            pytest.approx((0.010, 0.030, 0.040, 0.015))
        assert row["total_ms"] == pytest.approx(0.100) and row["other_ms"] == pytest.approx(0.005)
        assert row["communication_ms"] == pytest.approx(0.018)  # the kernel's 18 µs, not the launch's 1


@pytest.mark.parametrize("kernel", ["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclKernel_AllReduce_RING_LL_Sum_float",
                                    "ncclDevKernel_SendRecv", "ncclDevKernel_Reduce_Sum_f32_RING_LL",
                                    "ncclDevKernel_Broadcast_RING_LL", "Memcpy PtoP (Device -> Device)"])
def test_collectives_are_read_from_the_gpu_kernels_of_ddp_pp_and_dataparallel(kernel):
    from trainer_backend.telemetry.profiling import step_breakdown

    [row] = step_breakdown(cuda_step(0, comm=kernel))
    assert row["communication_ms"] == pytest.approx(0.018)


def test_gather_ops_are_not_communication():
    from trainer_backend.telemetry.profiling import step_breakdown

    [cuda_row] = step_breakdown(cuda_step(0, comm=None))
    host_only = [e for e in cuda_step(0, comm=None) if e.device_type.name == "CPU"]
    [cpu_row] = step_breakdown(host_only)
    assert cuda_row["communication_ms"] == 0 and cpu_row["communication_ms"] == 0


def test_gloo_collectives_are_read_from_the_host_where_no_gpu_ran():
    from trainer_backend.telemetry.profiling import step_breakdown

    host_only = [e for e in cuda_step(0) if e.device_type.name == "CPU"]
    host_only += [event("gloo:all_reduce", 55, 75), event("c10d::allreduce_", 54, 60)]
    [row] = step_breakdown(host_only)
    assert row["communication_ms"] == pytest.approx(0.021)  # union of 54-75 (and the 1 µs nccl: launch inside)


@pytest.mark.parametrize("no_driver", [True, False])
def test_only_kinetos_no_driver_line_is_dropped_and_only_without_a_driver(capfd, no_driver):
    from trainer_backend.telemetry.profiling import _quiet_profiler_lines

    lines = [b"ERROR:2026 DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35\n",
             b"ERROR: a real error\n", b"warning: something else\n"]
    with _quiet_profiler_lines(drop_no_driver=no_driver):
        for line in lines:
            os.write(2, line)
    kept = capfd.readouterr().err
    assert kept == b"".join(lines[1:] if no_driver else lines).decode()

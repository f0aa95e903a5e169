"""FLOPs per image, the devices' peak, and model FLOPs utilisation (MFU).

    flops = flops_per_image(model, in_chans=3, image_size=32)        # once per run, forward + backward
    peak = device_peak(devices, amp_dtype, processes=2)               # Peak(tflops, source) or Peak(None, why)
    achieved_tflops(flops, images, train_time_s), mfu(achieved, peak)

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` (one multiply-add = 2 FLOPs; it
counts matrix multiplies and convolutions, forward and backward, which is where a vision model's
arithmetic is) on a copy of the model on the meta device: no memory, no data, a fraction of a second.
GPU peaks come from NVIDIA's datasheets (dense, no sparsity). The CPU has no datasheet figure we
can trust for the cores a run gets, so its peak is measured: a large fp32 matmul over the threads
one of the run's processes uses, cached per machine (CPU model and thread count) under PARALLAX_HOME.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import platform
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

# BatchNorm in train mode refuses a batch of one; FLOPs are linear in the batch, so two is enough.
COUNT_BATCH = 2
CPU_PEAK_FILE = "cpu_peak_tflops.json"
CPU_MATMUL_SIZE = 1024  # 2.1 GFLOP a product: long enough to reach the BLAS kernel's rate, short enough for start-up
CPU_MATMUL_SECONDS = 0.4
MEASURED_ON_CPU = "measured on this CPU"


def flops_per_image(model: nn.Module, *, in_chans: int, image_size: int) -> float:
    """FLOPs of one training image, forward and backward, counted on a meta-device copy of ``model``
    (the unwrapped model, before any strategy moves or shards it)."""
    # Tensors go to the meta device as the module is copied: a copy first and a move after would
    # hold a second set of the (perhaps pretrained, perhaps large) weights in host memory meanwhile.
    memo = {id(t): nn.Parameter(t.detach().to("meta"), requires_grad=t.requires_grad)
            if isinstance(t, nn.Parameter) else t.to("meta") for t in (*model.parameters(), *model.buffers())}
    meta = copy.deepcopy(model, memo).to("meta").train()
    images = torch.empty(COUNT_BATCH, in_chans, image_size, image_size, device="meta")
    with FlopCounterMode(display=False) as counter:
        logits = meta(images)
        labels = torch.zeros(COUNT_BATCH, dtype=torch.long, device="meta")
        F.cross_entropy(logits, labels).backward()
    return counter.get_total_flops() / COUNT_BATCH


def count_flops_per_image(model: nn.Module, *, in_chans: int, image_size: int) -> float | None:
    """``flops_per_image``, or None (the reason in the run's log) for a model whose operations the
    meta device cannot run: the run goes on without MFU rather than fail for a measurement."""
    try:
        return flops_per_image(model, in_chans=in_chans, image_size=image_size)
    except Exception as exc:  # any model code: timm's, a plugin's
        print(f"FLOPs not counted: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return None


def achieved_tflops(flops_per_image: float, images: float, train_time_s: float) -> float:
    return flops_per_image * images / train_time_s / 1e12


def mfu(achieved: float, peak_tflops: float | None) -> float | None:
    return achieved / peak_tflops if peak_tflops else None


# Dense peak TFLOPS per GPU (Tensor Core figures without sparsity: datasheets print the sparse figure
# with an asterisk, twice the dense one). Matched as whole model tokens of torch.cuda.get_device_name()
# (``gpu_peak``), first match wins, so the more specific names come first. fp16/bf16 are with fp32
# accumulate (autocast's).
GPU_PEAKS_TFLOPS: list[tuple[str, dict[str, float]]] = [
    # NVIDIA H200 Tensor Core GPU datasheet (2024), H200 SXM column: FP32 67, TF32 989*, BF16/FP16 1,979*.
    ("H200 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),  # same datasheet, NVL column
    ("H200", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}),
    # NVIDIA H100 Tensor Core GPU datasheet (2023): SXM FP32 67, TF32 989*, BF16/FP16 1,979*;
    # PCIe FP32 51, TF32 756*, BF16/FP16 1,513*; NVL FP32 60, TF32 835*, BF16/FP16 1,671*.
    ("H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    ("H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5}),
    ("H100", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}),  # SXM5 reports "H100 80GB HBM3"
    # NVIDIA A100 Tensor Core GPU datasheet (2021): SXM and PCIe alike, FP32 19.5, TF32 156, BF16/FP16 312.
    ("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    # NVIDIA L40S datasheet (2023): FP32 91.6, TF32 183, BF16/FP16 362.05.
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05}),
    # NVIDIA L40 datasheet (2022): FP32 90.5, TF32 90.5, BF16/FP16 181.
    ("L40", {"fp32": 90.5, "tf32": 90.5, "bf16": 181.0, "fp16": 181.0}),
    # NVIDIA L4 Tensor Core GPU datasheet (2023): FP32 30.3, TF32 120*, BF16/FP16 242*.
    ("L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    # NVIDIA A40 datasheet (2021): FP32 37.4, TF32 74.8, BF16/FP16 149.7.
    ("A40", {"fp32": 37.4, "tf32": 74.8, "bf16": 149.7, "fp16": 149.7}),
    # NVIDIA A10 Tensor Core GPU datasheet (2021): FP32 31.2, TF32 62.5, BF16/FP16 125.
    ("A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    # NVIDIA Tesla V100 datasheet (2020): SXM2 FP32 15.7, Tensor (FP16) 125; PCIe FP32 14, Tensor 112.
    # Volta has no TF32 and no BF16 units.
    ("V100-PCIE", {"fp32": 14.0, "fp16": 112.0}),
    ("V100", {"fp32": 15.7, "fp16": 125.0}),
    # NVIDIA T4 Tensor Core GPU datasheet (2019): FP32 8.1, mixed precision (FP16/FP32) 65.
    ("T4", {"fp32": 8.1, "fp16": 65.0}),
    # NVIDIA Ada Lovelace GPU architecture whitepaper v2.1, RTX 4090: FP32 82.6, TF32 82.6,
    # BF16 and FP16 with FP32 accumulate 165.2.
    ("RTX 4090", {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2}),
    # NVIDIA Ampere GA102 GPU architecture whitepaper v2, RTX 3090: FP32 35.6, TF32 35.6,
    # BF16 and FP16 with FP32 accumulate 71.
    ("RTX 3090", {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0}),
]


@dataclass(frozen=True)
class Peak:
    """Peak TFLOPS of every device a run computes on together, or None and why not."""

    tflops: float | None
    source: str


def conv_in_tf32() -> bool:
    """Whether cuDNN convolutions of fp32 tensors run in TF32 (on by default: ``cudnn.allow_tf32``, or
    ``torch.backends.cudnn.conv.fp32_precision``). Reading the legacy flag raises where the two APIs
    were mixed; the per-operator setting answers then."""
    if not torch.backends.cudnn.enabled:
        return False  # PyTorch's own convolution kernels: plain fp32
    precision = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", None)  # PyTorch 2.9 on
    if precision in ("tf32", "ieee"):
        return precision == "tf32"
    with contextlib.suppress(RuntimeError):
        return bool(torch.backends.cudnn.allow_tf32)
    return False


def matmul_in_tf32() -> bool:
    """Whether cuBLAS matrix multiplies of fp32 tensors run in TF32 (off by default:
    ``torch.backends.cuda.matmul.allow_tf32``, ``fp32_precision`` or ``set_float32_matmul_precision``)."""
    precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)  # PyTorch 2.9 on
    if precision in ("tf32", "ieee"):
        return precision == "tf32"
    with contextlib.suppress(RuntimeError):
        return bool(torch.backends.cuda.matmul.allow_tf32)
    return False


def gpu_arithmetic(device: torch.device, amp_dtype: torch.dtype | None) -> tuple[str, str]:
    """(the peak table's dtype, in words what the convolutions and matrix multiplies run in).
    Under autocast both run in its dtype. Without it each follows its own TF32 switch (Ampere and
    later only); where they differ the TF32 peak is taken, the higher one: a vision model's
    arithmetic is mostly convolutions, and an MFU is never overstated by a higher peak."""
    if amp_dtype in (torch.bfloat16, torch.float16):
        dtype = "bf16" if amp_dtype == torch.bfloat16 else "fp16"
        return dtype, f"autocast {dtype}"
    if torch.cuda.get_device_capability(device) < (8, 0):
        return "fp32", "fp32 (no TF32 before Ampere)"
    conv, matmul = conv_in_tf32(), matmul_in_tf32()
    if conv == matmul:
        return ("tf32", "convolutions and matrix multiplies in TF32") if conv else (
            "fp32", "convolutions and matrix multiplies in fp32")
    return "tf32", ("convolutions in TF32, matrix multiplies in fp32" if conv else
                    "matrix multiplies in TF32, convolutions in fp32")


def gpu_dtype(device: torch.device, amp_dtype: torch.dtype | None) -> str:
    """The peak table's dtype for the run's arithmetic (see ``gpu_arithmetic``)."""
    return gpu_arithmetic(device, amp_dtype)[0]


# Words after a model number that make it another board: an "RTX 3090 Ti" or "RTX 4090 Laptop GPU"
# is not an RTX 3090 or 4090.
VARIANT_WORDS = r"(?:Ti|SUPER|D|Laptop|Mobile|Max-Q)"


def gpu_peak(name: str, dtype: str) -> tuple[float, str] | None:
    """(dense TFLOPS, the table row) for a GPU named ``name`` in ``dtype``; None when not in the table.
    A row matches whole model tokens only: "NVIDIA T400" is no T4, "RTX A1000" no A100, "RTX A4000"
    no A40 (a substring match would give each the other board's peak)."""
    for key, peaks in GPU_PEAKS_TFLOPS:
        pattern = rf"(?<![\w-]){re.escape(key)}(?!\w)(?!\s+{VARIANT_WORDS}\b)"
        if re.search(pattern, name, flags=re.IGNORECASE) and dtype in peaks:
            return peaks[dtype], f"{key} {dtype} (NVIDIA datasheet)"
    return None


def device_peak(devices: list[torch.device], amp_dtype: torch.dtype | None, *, processes: int = 1) -> Peak:
    """The peak of ``devices`` together (those of one process), times ``processes`` processes like it."""
    kinds = {d.type for d in devices}
    if kinds == {"cpu"}:
        per_process = cpu_peak_tflops(torch.get_num_threads())
        return Peak(per_process * processes, MEASURED_ON_CPU)
    if kinds != {"cuda"}:
        return Peak(None, f"no peak for a run that mixes devices ({', '.join(sorted(kinds))})")
    total, sources = 0.0, []
    for device in devices:
        name, (dtype, arithmetic) = torch.cuda.get_device_name(device), gpu_arithmetic(device, amp_dtype)
        found = gpu_peak(name, dtype)
        if found is None:
            return Peak(None, f"no datasheet peak for GPU {name!r} in {dtype} ({arithmetic}): MFU not computed")
        total += found[0]
        sources.append(f"{found[1]}: {arithmetic}")
    return Peak(total * processes, ", ".join(dict.fromkeys(sources)))


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_peak_tflops(threads: int, cache_dir: Path | None = None, *, at_least: float = 0.0) -> float:
    """fp32 matmul TFLOPS of this CPU over ``threads`` threads, measured once per machine and thread
    count and cached beside the dataset caches (``data_dir()``: ``PARALLAX_HOME/data``, or
    ``PARALLAX_DATA_DIR``), so that homes sharing a data folder share the measurement too.

    ``at_least``: a rate the caller has seen this CPU reach, above the cached peak. The cached peak
    was then measured while other work held the cores: measure again and keep the better of the two."""
    if cache_dir is None:
        from contract.environment import data_dir

        cache_dir = data_dir()
    path = cache_dir / CPU_PEAK_FILE
    key = f"{cpu_model()} | {threads} threads"
    cache: dict = {}
    with contextlib.suppress(OSError, ValueError):
        cache = json.loads(path.read_text())
    cached = float(cache[key]) if isinstance(cache.get(key), (int, float)) and cache[key] > 0 else 0.0
    if cached > at_least:
        return cached
    cache[key] = max(cached, measure_cpu_matmul_tflops(threads))
    with contextlib.suppress(OSError):  # a read-only folder only costs a measurement next time
        # A file of its own to rename into place: processes sharing the folder may write at once.
        handle, part = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".part")
        try:
            with os.fdopen(handle, "w") as out:
                out.write(json.dumps(cache, indent=1))
            os.replace(part, path)
        except OSError:  # a full disk: no part file is left behind to fill it further
            with contextlib.suppress(OSError):
                os.unlink(part)
            raise
    return cache[key]


def measure_cpu_matmul_tflops(threads: int, size: int = CPU_MATMUL_SIZE, seconds: float = CPU_MATMUL_SECONDS) -> float:
    """The best rate of repeated ``size``² fp32 matrix products: the best, not the mean, since the
    machine may be busy with other work and a peak is what the hardware can do."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        torch.mm(a, b)  # the first call sets up the BLAS kernels
        best, deadline = 0.0, time.perf_counter() + seconds
        for _ in range(200):
            start = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * size**3 / (time.perf_counter() - start) / 1e12)
            if time.perf_counter() > deadline:
                break
        return best
    finally:
        torch.set_num_threads(previous)

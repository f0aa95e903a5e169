"""--data-on-device: whether a CUDA run keeps the cached dataset on its GPU (judged by the free
memory, after the model is placed), the copy that puts it there (in chunks, into one tensor on the
device), and ``on`` refused where it cannot fit, before launch and in the rank. CUDA's answers are
faked at its edge (``torch.cuda.mem_get_info``, the device properties, NVML); the copy runs for real
with the CPU as its target.

    .venv/bin/python -m pytest tests/trainer_backend/rank/test_data_on_device.py -q
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.nvml_machines import TWO_GPUS, fake_nvml, pin_cuda_count  # noqa: F401
from contract.config import ConfigError, RunConfig
from trainer_backend.datasets.tensor_dataset import DEVICE_DATA_SHARE, ImageTensorDataset
from trainer_backend.rank.trainer import keep_on_device, load_data

MB = 2**20


@pytest.fixture
def digits(parallax_home):
    config = RunConfig(image_size=16)
    data = load_data(config)
    return data, data.train.stored_bytes + data.val.stored_bytes


def fake_cuda_memory(monkeypatch, *, free: int, total: int) -> None:
    """A GPU with ``total`` bytes of which ``free`` are free now (another run holds the rest)."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(total_memory=total, major=9, minor=0))


def test_auto_judges_by_the_free_memory_not_the_total(digits, monkeypatch):
    """A GPU of 1,000 times the set's size, with another run's work leaving five times it free: a
    tenth of the total would keep it, a tenth of the free memory does not."""
    data, needed = digits
    fake_cuda_memory(monkeypatch, free=5 * needed, total=1000 * needed)
    assert keep_on_device(data, torch.device("cuda:0"), "auto") is None


def test_each_mode_keeps_the_set_as_it_says(digits):
    data, needed = digits
    cpu = torch.device("cpu")  # the target the copy can run to here; the free memory is given
    share = int(needed / DEVICE_DATA_SHARE)
    assert keep_on_device(data, cpu, "auto", free_bytes=share - 1) is None
    assert keep_on_device(data, cpu, "auto", free_bytes=share + 1) is not None
    assert keep_on_device(data, cpu, "off", free_bytes=1000 * needed) is None
    kept = keep_on_device(data, cpu, "on", free_bytes=2 * needed)  # beyond the share, within the free memory
    assert kept is not None and kept.train.on_device and len(kept.train) == len(data.train)
    with pytest.raises(ConfigError) as refused:
        keep_on_device(data, cpu, "on", free_bytes=needed - 1)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("data_on_device on: the dataset's")
    assert f"{needed / MB:,.0f} MB of stored pixels do not fit" in message and "use auto" in message


def test_on_that_cannot_fit_a_gpu_is_refused_in_one_line_before_launch(digits, fake_nvml, monkeypatch):  # noqa: F811
    """Preflight reads NVML's free memory (no CUDA context): cuda:1 is the A6000 of TWO_GPUS."""
    from trainer_backend.supervisor.preflight import check_data_fits

    _, needed = digits
    pin_cuda_count(monkeypatch, 2)
    total_mb = TWO_GPUS[0]["memory_total_mb"]
    fake_nvml([{**TWO_GPUS[0], "memory_used_mb": total_mb - needed / MB / 2}, TWO_GPUS[1]])
    config = RunConfig(image_size=16, devices=("cuda:1",), data_on_device="on")
    with pytest.raises(ConfigError, match=r"^data_on_device on: .* do not fit in the \d+ MB free on cuda:1: use auto"):
        check_data_fits(config, needed)
    check_data_fits(config.replace(devices=("cuda:0",)), needed)  # the 4090 has room
    check_data_fits(config.replace(data_on_device="auto"), needed)  # auto falls back to host memory


@pytest.mark.parametrize("indexed", [True, False])
def test_the_copy_fills_one_tensor_a_chunk_at_a_time(indexed):
    """The host holds one chunk of rows at a time, never the whole split: no gather, slice or copy
    on the host is larger than a chunk, and the split's ``images`` (a gathered copy) is never made."""
    generator = torch.Generator().manual_seed(0)
    pool = torch.randint(0, 256, (50, 3, 8, 8), dtype=torch.uint8, generator=generator)
    indices = torch.randperm(50, generator=generator)[:37] if indexed else None
    labels = torch.randint(0, 10, (37 if indexed else 50,), generator=generator)
    split = ImageTensorDataset(pool, labels, torch.zeros(3), torch.ones(3), num_classes=10, indices=indices)
    chunk_bytes = 5 * 3 * 8 * 8  # five images

    class Sizes(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.made: list[tuple[str, int]] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dtype == torch.uint8:
                self.made.append((getattr(func, "__name__", str(func)), out.numel()))
            return out

    def no_whole_copy(self):
        raise AssertionError("the whole split was gathered on the host")

    with pytest.MonkeyPatch.context() as patch, Sizes() as sizes:
        patch.setattr(ImageTensorDataset, "images", property(no_whole_copy))
        moved = split.to_device(torch.device("cpu"), chunk_bytes=chunk_bytes)
    whole = len(split) * 3 * 8 * 8
    assert [name for name, size in sizes.made if size >= whole] == ["empty"]  # the one tensor on the device
    assert max(size for name, size in sizes.made if name != "empty") <= chunk_bytes
    expected = pool if indices is None else pool.index_select(0, indices)
    assert torch.equal(moved.pool_images, expected) and moved.indices is None and moved.on_device
    assert torch.equal(moved.labels, labels)


def test_the_estimate_counts_the_set_by_each_gpus_free_memory_and_the_mode(fake_nvml, monkeypatch):  # noqa: F811
    from trainer_backend.rank.forecast.memory_estimate import estimate_memory

    pin_cuda_count(monkeypatch, 2)
    config = RunConfig(model="resnet18", image_size=96, batch_size=128, devices=("cuda:1",), amp="bf16")

    def data_on_gpu(used_mb: float, **changes) -> int:
        fake_nvml([{**TWO_GPUS[0], "memory_used_mb": used_mb}, TWO_GPUS[1]])
        return estimate_memory(config.replace(**changes), num_classes=10, in_chans=3).devices[0].data

    total_mb = TWO_GPUS[0]["memory_total_mb"]
    stored = data_on_gpu(0)
    assert stored > 0
    assert data_on_gpu(total_mb - 100) == 0  # 100 MB free: digits at 96 px (16 MB) is more than a tenth
    assert data_on_gpu(total_mb - 100, data_on_device="on") == stored
    assert data_on_gpu(0, data_on_device="off") == 0


def test_the_field_is_checked_where_only_a_cuda_run_over_the_cache_can_keep_it(monkeypatch):
    pin_cuda_count(monkeypatch, 1)
    assert RunConfig().data_on_device == "auto"
    with pytest.raises(ConfigError, match="^data_on_device 'sometimes' is not allowed: choose one of auto, on, off"):
        RunConfig(data_on_device="sometimes")
    with pytest.raises(ConfigError, match="data_on_device on keeps the dataset on a GPU, and this run trains on cpu"):
        RunConfig(data_on_device="on")
    with pytest.raises(ConfigError, match="decode workers decodes every epoch"):
        RunConfig(devices=("cuda:0",), decode="workers", data_on_device="on")
    assert RunConfig(devices=("cuda:0",), data_on_device="on").data_on_device == "on"

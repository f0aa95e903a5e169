"""The fast GPU data paths, exercised on CPU with fakes at the CUDA edge only: a batch kept on the device
and a JPEG batch decoded there cost no blocking host-to-device copy and no host read, validation's
confusion counts stay on the device, and the GPU decode's outputs are ordered against the training stream.

Two stand-ins for a GPU: the ``meta`` device (tensors with shapes and no data, so every kernel is free
and every host-to-device copy is seen as one), and fake CUDA streams that log what was queued where.
tests/system/test_gpu.py runs the same paths on a real GPU under CUDA's sync debug mode.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader

from contract.config import RunConfig
from trainer_backend.datasets import device_decode
from trainer_backend.datasets.device_decode import DeviceJpegDecode, EncodedImages
from trainer_backend.datasets.tensor_dataset import ImageTensorDataset, collate_batch
from trainer_backend.rank.batchnorm import statistics_loader
from trainer_backend.rank.confusion import confusion_record
from trainer_backend.rank.loop import validate
from trainer_backend.rank.strategies import Strategy

DEVICE = torch.device("meta")  # stands for the GPU
aten = torch.ops.aten
# Ops whose CUDA kernels read device memory back to the host before they return: each is a blocking sync.
HOST_READS = {aten._local_scalar_dense, aten.bincount, aten.nonzero, aten.masked_select, aten._unique2,
              aten.unique_dim, aten.unique_consecutive, aten.equal, aten.is_nonzero}


class HostTransfers(TorchDispatchMode):
    """Every host-to-device copy and every host read of device data made while it is active.

    ``copies``: (non_blocking, from pinned memory) per copy from a CPU tensor to another device,
    whether through ``Tensor.to``/``copy_`` or a tensor made from host data with a ``device``
    (``torch.tensor``/``torch.as_tensor``, which copy below the dispatcher). ``reads``: the names of
    the ops that read back (HOST_READS), with the device they read from. Pinning is faked: there is no
    CUDA here."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.copies: list[tuple[bool, bool]] = []
        self.reads: list[tuple[str, str]] = []
        self._pinned: list[torch.Tensor] = []  # kept alive, so that their addresses stay theirs
        self.active = False
        monkeypatch.setattr(torch.Tensor, "pin_memory", lambda tensor, device=None: self._pin(tensor))
        for name in ("tensor", "as_tensor"):
            monkeypatch.setattr(torch, name, self._made_from_host(getattr(torch, name)))

    def __enter__(self):
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc):
        self.active = False
        return super().__exit__(*exc)

    def _pin(self, tensor: torch.Tensor) -> torch.Tensor:
        pinned = tensor.clone()
        self._pinned.append(pinned)
        return pinned

    def _is_pinned(self, tensor: torch.Tensor) -> bool:
        return any(tensor.data_ptr() == pinned.data_ptr() for pinned in self._pinned)

    def _made_from_host(self, make):
        def made(data, *args, device=None, **kwargs):
            if self.active and device is not None and torch.device(device).type != "cpu" and not (
                    isinstance(data, torch.Tensor) and data.device.type != "cpu"):
                self.copies.append((False, False))  # a pageable copy that waits
            return make(data, *args, device=device, **kwargs)
        return made

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in HOST_READS:
            devices = {arg.device.type for arg in args if isinstance(arg, torch.Tensor)}
            self.reads.append((func.overloadpacket.__name__, "cpu" if devices == {"cpu"} else "device"))
        if func is aten._to_copy.default and args[0].device.type == "cpu" and \
                torch.device(kwargs.get("device") or "cpu").type != "cpu":
            self.copies.append((bool(kwargs.get("non_blocking")), self._is_pinned(args[0])))
        if func is aten.copy_.default and args[1].device.type == "cpu" and args[0].device.type != "cpu":
            self.copies.append((bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking")),
                                self._is_pinned(args[1])))
        return func(*args, **kwargs)


@pytest.fixture
def host_transfers(monkeypatch):
    return HostTransfers(monkeypatch)


def blocking(copies: list[tuple[bool, bool]]) -> list[tuple[bool, bool]]:
    """The copies that wait for the device's queued work: not queued from pinned memory."""
    return [copy for copy in copies if copy != (True, True)]


# --- a dataset kept on the GPU: training, validation and BatchNorm batches ---

def kept_split(images: int = 40, classes: int = 4) -> ImageTensorDataset:
    generator = torch.Generator().manual_seed(0)
    pool = torch.randint(0, 256, (images + 10, 3, 8, 8), dtype=torch.uint8, generator=generator)
    rows = torch.randperm(images + 10, generator=generator)[:images]
    labels = torch.arange(images) % classes
    split = ImageTensorDataset(pool, labels, torch.full((3,), 0.5), torch.full((3,), 0.25), num_classes=classes,
                               indices=rows)
    return split.to_device(DEVICE)


def test_a_batch_kept_on_the_gpu_is_gathered_without_a_blocking_copy(host_transfers):
    """Before, each batch's positions went to the GPU twice from pageable memory, each copy waiting for
    every kernel queued before it (the previous step): the host could never run a step ahead, and that
    wait was booked as the next step's data time."""
    split = kept_split()
    train = DataLoader(split, batch_size=8, shuffle=True, collate_fn=collate_batch,
                       generator=torch.Generator().manual_seed(0))
    loaders = {"training": train, "validation": DataLoader(split, batch_size=8, collate_fn=collate_batch),
               "BatchNorm": statistics_loader(train, 24, 0, full_batches=False)}
    for name, loader in loaders.items():
        with host_transfers:
            batches = [(split.normalise(images), labels) for images, labels in loader]
        assert len(batches) == len(loader) >= 3
        assert all(images.device == labels.device == DEVICE and images.dtype == torch.float32
                   for images, labels in batches)
        assert host_transfers.copies, f"{name}: the audit saw no copy at all"  # the positions do go over
        assert not blocking(host_transfers.copies), f"{name} batches: {host_transfers.copies}"
        # (The sampler's seed is drawn with .item() from a CPU tensor: not a read of the device.)
        assert ("_local_scalar_dense", "cpu") in host_transfers.reads or name != "training"
        assert not [read for read in host_transfers.reads if read[1] != "cpu"], f"{name}: {host_transfers.reads}"
        host_transfers.reads.clear()
        host_transfers.copies.clear()
    # The rows gathered are the split's own, in the loader's order (checked where pixels exist: on the CPU).
    on_host = ImageTensorDataset(torch.arange(12, dtype=torch.uint8).view(12, 1, 1, 1).expand(12, 3, 2, 2),
                                 torch.arange(4), torch.zeros(3), torch.ones(3), indices=torch.tensor([9, 2, 7, 4]))
    pixels, labels = on_host.__getitems__([3, 0, 2])
    assert pixels[:, 0, 0, 0].tolist() == [4, 9, 7] and labels.tolist() == [3, 0, 2]


# --- JPEGs decoded on the GPU ---

def decoded_sizes(monkeypatch, sizes: list[tuple[int, int]]) -> None:
    """The device decode hands back images of ``sizes`` (a photo folder's mixed shapes) on DEVICE."""
    def decode(files, device):
        return [torch.empty(3, height, width, dtype=torch.uint8, device=device) for height, width in sizes]
    monkeypatch.setattr(device_decode, "decode_on_device", decode)


def test_a_batch_of_mixed_sizes_is_decoded_without_a_copy_per_size(monkeypatch, host_transfers):
    """Before, each distinct image size cost a blocking copy of its rows' positions; a folder of
    photos has nearly one size per image."""
    sizes = [(48, 40), (32, 32), (48, 40), (60, 80), (32, 32), (33, 47)]
    decoded_sizes(monkeypatch, sizes)
    encoded = EncodedImages(torch.zeros(len(sizes), dtype=torch.uint8), torch.arange(len(sizes) + 1), DEVICE)
    with host_transfers:
        stored = DeviceJpegDecode(32, lambda pixels: pixels).stored_pixels(encoded)
    assert stored.shape == (len(sizes), 3, 32, 32) and stored.dtype == torch.uint8 and stored.device == DEVICE
    assert not host_transfers.copies and not host_transfers.reads, (host_transfers.copies, host_transfers.reads)


def test_a_mixed_batch_keeps_its_order(monkeypatch):
    """The rows put back without an index tensor are each image's own (on the CPU, where pixels exist)."""
    sizes = [(40, 40), (32, 32), (40, 40), (32, 32), (24, 30)]

    def decode(files, device):
        return [torch.full((3, height, width), 10 * row, dtype=torch.uint8) for row, (height, width) in enumerate(sizes)]
    monkeypatch.setattr(device_decode, "decode_on_device", decode)
    encoded = EncodedImages(torch.zeros(len(sizes), dtype=torch.uint8), torch.arange(len(sizes) + 1))
    stored = DeviceJpegDecode(32, lambda pixels: pixels).stored_pixels(encoded)
    assert [int(row.float().mean()) for row in stored] == [0, 10, 20, 30, 40]


class FakeStream:
    """A CUDA stream that logs what it is asked to do; ``torch.cuda.stream`` and ``current_stream``
    are faked around it, as CUDA keeps one current stream per device."""

    current: FakeStream
    log: list[tuple]
    made: list[FakeStream]

    def __init__(self, device=None, name: str = "decode"):
        self.name = name
        FakeStream.made.append(self)

    def wait_stream(self, other: FakeStream) -> None:
        FakeStream.log.append(("wait", self.name, other.name))

    def __repr__(self) -> str:
        return f"stream {self.name}"


@pytest.fixture
def fake_cuda_streams(monkeypatch):
    FakeStream.log, FakeStream.made = [], []
    FakeStream.current = FakeStream(name="training")

    @contextlib.contextmanager
    def stream(chosen: FakeStream):
        before, FakeStream.current = FakeStream.current, chosen
        try:
            yield
        finally:
            FakeStream.current = before

    def record_stream(tensor: torch.Tensor, stream: FakeStream) -> None:
        FakeStream.log.append(("record", id(tensor), stream.name))

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream.current)
    monkeypatch.setattr(torch.Tensor, "record_stream", record_stream)
    monkeypatch.setattr(device_decode, "_decode_streams", {}, raising=False)
    return FakeStream.log


@pytest.mark.usefixtures("own_data_dir")
def test_the_gpu_decode_writes_no_memory_the_training_stream_may_still_read(parallax_home, tmp_path, monkeypatch,
                                                                          fake_cuda_streams):
    """torchvision takes the decode's outputs from the current stream's pool and nvJPEG writes them
    unordered with that stream's queued work. Decoded with the training stream current, a block its
    queued backward still reads can be handed to the decode and overwritten. The decode must run
    with a stream of its own current, the training stream must wait for it, and every output must
    be recorded as used by the training stream (else its block could return to the decode stream's
    pool while the training stream still reads it)."""
    import torchvision.io

    from tests.trainer_backend.datasets.test_streaming_decode import make_jpeg_folder
    from trainer_backend.datasets import prepare_data

    make_jpeg_folder(tmp_path / "jpegs", 6, 40)
    data = prepare_data(str(tmp_path / "jpegs"), image_size=32, decode="workers")
    encoded_split = data.train.with_output("encoded")
    encoded, _ = encoded_split.__getitems__(list(range(len(encoded_split))))
    decode_batch = encoded_split.normalise.decoded
    on_cpu = decode_batch(encoded.files(), torch.device("cpu"))
    outputs: list[int] = []
    real_decode = torchvision.io.decode_jpeg

    def decode(files, mode, device):  # nvJPEG at the edge: the CPU's decoder, noting the stream current at the call
        assert torch.device(device) == torch.device("cuda:0")
        FakeStream.log.append(("decode", FakeStream.current.name))
        images = real_decode(files, mode=mode, device="cpu")
        outputs.extend(id(image) for image in images)
        return images

    monkeypatch.setattr(torchvision.io, "decode_jpeg", decode)
    images = decode_batch(encoded.files(), torch.device("cuda:0"))
    assert len(images) == len(on_cpu) == len(encoded) and all(map(torch.equal, images, on_cpu))
    log = fake_cuda_streams
    assert log[0] == ("decode", "decode"), log  # not on the training stream's pool
    assert log[1] == ("wait", "training", "decode"), log
    assert sorted(entry[1] for entry in log[2:]) == sorted(outputs) and len(outputs) == len(encoded)
    assert all(entry[0] == "record" and entry[2] == "training" for entry in log[2:]), log
    assert FakeStream.current.name == "training"  # the decode stream is current only for the decode
    # A second batch decodes on the same stream: one per device, not one per call.
    decode_batch(encoded.files(), torch.device("cuda:0"))
    assert [stream.name for stream in FakeStream.made] == ["training", "decode"]
    assert [entry for entry in log if entry[0] == "decode"] == [("decode", "decode")] * 2


# --- validation's confusion counts ---

class Guess(nn.Module):
    """Logits from the images' first pixel: a fixed, known prediction per image."""

    def __init__(self, classes: int):
        super().__init__()
        self.classes = classes

    def forward(self, images):
        guess = images[:, 0, 0, 0].long() % self.classes
        return (guess[:, None] == torch.arange(self.classes, device=images.device)).float()


class Batches(list):
    """Validation batches, as evaluate takes them (any iterable with its dataset's class count)."""

    def __init__(self, batches, num_classes: int):
        super().__init__(batches)
        self.dataset = SimpleNamespace(num_classes=num_classes)


def test_validation_counts_its_confusion_on_the_device_and_leaves_one_read_per_epoch(host_transfers):
    """Before, CUDA's bincount read each batch's (label, prediction) pairs' min and max back to the
    host: two blocking reads per validation batch. Now the counts are added in place and the epoch
    reads them once, with the other totals. The CPU stands for the GPU here: every read counts."""
    classes, images = 3, 30
    pixels = torch.arange(images, dtype=torch.float32).view(images, 1, 1, 1) * 7
    labels = torch.arange(images) % classes
    loader = Batches(zip(pixels.split(4), labels.split(4)), classes)
    strategy = Strategy(RunConfig(strategy="single", devices="cpu"))
    with host_transfers:
        totals = validate(Guess(classes), loader, strategy)
    assert not host_transfers.reads, f"{len(loader)} batches read the device back: {host_transfers.reads}"
    predictions = (pixels[:, 0, 0, 0].long() % classes).tolist()
    hand = [[sum(1 for t, p in zip(labels.tolist(), predictions) if (t, p) == (row, col)) for col in range(classes)]
            for row in range(classes)]
    record = confusion_record(1, ["a", "b", "c"], totals[3:].tolist())  # the epoch's one read
    assert record["matrix"] == hand and sum(map(sum, hand)) == images
    assert totals[1].item() == sum(hand[c][c] for c in range(classes)) and totals[2].item() == images

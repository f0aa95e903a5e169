"""Decoding in the loader workers, fast: what the workers hand over for each device, the same
normalised bits wherever the normalisation runs, JPEGs decoded at a libjpeg scale, and the GPU
decode's path (bytes in the workers, decode and resize on the device) run on the CPU's decoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from trainer_backend.datasets.streaming import loader_output, place_decoding
from trainer_backend.supervisor.runner import engine_forkserver


def make_jpeg_folder(root, count: int, size: int, seed: int = 0) -> None:
    """``count`` smooth RGB JPEGs of ``size`` px in two classes (gradients and a block: what JPEG keeps well)."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, size)
    for i in range(count):
        folder = root / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        r, g, b = rng.uniform(0.2, 1.0, 3)
        pixels = np.stack([np.outer(ramp, np.ones(size)) * r, np.outer(np.ones(size), ramp) * g,
                           np.full((size, size), b)], axis=-1) * 255
        corner = int(rng.integers(0, size // 2))
        pixels[corner:corner + size // 4, corner:corner + size // 4] = rng.uniform(0, 255, 3)
        Image.fromarray(pixels.astype(np.uint8), "RGB").save(folder / f"{i}.jpg", quality=95)


@pytest.mark.parametrize(("device", "jpeg", "workers", "expected"), [
    ("cpu", True, 2, "normalised"), ("cpu", False, 2, "normalised"), ("cpu", True, 0, "stored"),
    ("cuda", True, 2, "encoded"), ("cuda", True, 0, "encoded"), ("cuda", False, 2, "stored"), ("mps", True, 2, "stored"),
])
def test_only_a_cuda_run_over_jpegs_decodes_on_the_device(device, jpeg, workers, expected):
    assert loader_output(device, jpeg=jpeg, workers=workers) == expected


@pytest.mark.usefixtures("own_data_dir")
def test_a_cpu_runs_workers_hand_over_the_batch_normalised_to_the_same_bits(parallax_home, tmp_path):
    from trainer_backend.datasets import prepare_data

    make_jpeg_folder(tmp_path / "jpegs", 12, 40)
    data = prepare_data(str(tmp_path / "jpegs"), image_size=32, decode="workers")
    assert data.train.jpeg and data.train.output == "stored"
    placed, note = place_decoding(data, torch.device("cpu"), workers=2)
    assert note is None and placed.train.output == placed.val.output == "normalised"
    picked = [0, 3, len(data.train) - 1]
    stored, labels = data.train.__getitems__(picked)
    normalised, same_labels = placed.train.__getitems__(picked)
    assert stored.dtype == torch.uint8 and normalised.dtype == torch.float32
    assert torch.equal(placed.train.normalise(normalised), data.train.normalise(stored))  # identity, same bits
    assert torch.equal(labels, same_labels)
    alone, _ = place_decoding(data, torch.device("cpu"), workers=0)
    assert alone.train.output == "stored"


@pytest.mark.usefixtures("own_data_dir")
def test_a_jpeg_far_larger_than_its_stored_size_is_decoded_at_a_libjpeg_scale(parallax_home, tmp_path):
    from trainer_backend.datasets.decoded import resize_unit_images, to_uint8
    from trainer_backend.datasets.image_files import decode_image_file, read_with_size

    make_jpeg_folder(tmp_path / "big", 1, 400)
    path = next((tmp_path / "big").rglob("*.jpg"))
    drafted, stored_size = read_with_size(path, draft_size=48)
    assert stored_size == (400, 400) and drafted.shape == (50, 50, 3)  # 1/8: the smallest scale still >= 48
    decoded = decode_image_file(path, 48, None, None)
    assert decoded.native_size == (400, 400) and decoded.pixels.shape == (3, 48, 48)
    with Image.open(path) as image:  # the full decode, resized as the cache resizes
        full = torch.from_numpy(np.asarray(image.convert("RGB")).copy()).permute(2, 0, 1).float() / 255
    reference = to_uint8(resize_unit_images(full[None], 48)[0])
    difference = (torch.from_numpy(np.ascontiguousarray(decoded.pixels)).float() - reference.float()).abs()
    # On average under a level of 255; along the block's hard edge the two filters put the edge a
    # fraction of a pixel apart (30 levels here), as any two downscalers would.
    assert difference.mean() < 1.5 and difference.max() <= 48


@pytest.mark.usefixtures("own_data_dir")
def test_the_device_decode_path_on_the_cpu_decoder_gives_the_cpu_decodes_batch(parallax_home, tmp_path):
    from trainer_backend.datasets import DatasetError, prepare_data
    from trainer_backend.datasets.device_decode import EncodedImages

    make_jpeg_folder(tmp_path / "jpegs", 12, 40)
    data = prepare_data(str(tmp_path / "jpegs"), image_size=32, decode="workers")
    encoded_split = data.train.with_output("encoded")
    picked = list(range(len(encoded_split)))
    encoded, labels = encoded_split.__getitems__(picked)
    assert isinstance(encoded, EncodedImages) and len(encoded) == len(picked)
    assert [f.numpy().tobytes() for f in encoded.files()] == [data.train.paths[i].read_bytes() for i in picked]
    # torchvision's decode_jpeg on the CPU stands in for nvJPEG: the batch's path is the same.
    images = encoded_split.normalise(encoded.to("cpu"))
    stored, same_labels = data.train.__getitems__(picked)
    expected = data.train.normalise(stored)
    assert images.shape == expected.shape == (len(picked), 3, 32, 32) and torch.equal(labels, same_labels)
    levels = (encoded_split.normalise.stored_pixels(encoded.to("cpu")).float() - stored.float()).abs()
    assert levels.max() <= 2, "the two decoders differ by more than their rounding"
    # A PNG among the JPEGs is named, not sent to the GPU's decoder.
    Image.new("RGB", (40, 40)).save(tmp_path / "not.png")
    (tmp_path / "not.png").rename(encoded_split.paths[0])
    with pytest.raises(DatasetError, match="is PNG, not JPEG"):
        encoded_split.__getitems__([0])


@pytest.mark.usefixtures("own_data_dir")
def test_a_device_that_cannot_decode_jpegs_leaves_the_decode_to_the_workers_and_says_why(parallax_home, tmp_path,
                                                                                         monkeypatch):
    from trainer_backend.datasets import device_decode, prepare_data

    make_jpeg_folder(tmp_path / "jpegs", 6, 24)
    data = prepare_data(str(tmp_path / "jpegs"), image_size=24, decode="workers")

    def refuse(files, device):
        raise RuntimeError("no nvJPEG in this build")

    monkeypatch.setattr(device_decode, "decode_on_device", refuse)
    placed, note = place_decoding(data, torch.device("cuda:0"), workers=2)
    assert placed.train.output == placed.val.output == "stored"
    assert "decoded in the loader workers" in note and "no nvJPEG in this build" in note


@pytest.mark.processes  # DataLoader workers
@pytest.mark.usefixtures("own_data_dir")
def test_batches_normalised_in_worker_processes_reach_the_training_process_whole(parallax_home, tmp_path):
    from torch.utils.data import DataLoader

    from trainer_backend.datasets import collate_batch, prepare_data

    make_jpeg_folder(tmp_path / "jpegs", 20, 40)
    data = prepare_data(str(tmp_path / "jpegs"), image_size=32, decode="workers")
    placed, _ = place_decoding(data, torch.device("cpu"), workers=2)
    loader = DataLoader(placed.train, batch_size=4, num_workers=2, collate_fn=collate_batch,
                        multiprocessing_context=engine_forkserver(), timeout=120)
    batches = [images for images, _ in loader]
    expected = data.train.normalise(data.train.__getitems__(list(range(len(data.train))))[0])
    assert torch.equal(torch.cat(batches), expected)


@pytest.mark.usefixtures("own_data_dir")
def test_a_batch_the_device_refuses_is_decoded_on_the_cpu_and_the_log_says_so_once(parallax_home, tmp_path,
                                                                                  monkeypatch, capsys):
    """nvJPEG refuses some JPEGs the first file's check cannot foresee (CMYK, 12-bit): such a batch
    is decoded on the CPU and moved to the device, not a failed run; a file no decoder takes is one
    line naming both. The device here is "meta", refused as a GPU's decoder would refuse."""
    from trainer_backend.datasets import DatasetError, device_decode, prepare_data

    make_jpeg_folder(tmp_path / "jpegs", 6, 24)
    data = prepare_data(str(tmp_path / "jpegs"), image_size=24, decode="workers")
    split = data.train.with_output("encoded")
    real_decode = device_decode.decode_on_device

    def gpu_refuses(files, device):
        if device.type != "cpu":
            raise RuntimeError("nvJPEG: unsupported JPEG")
        return real_decode(files, device)

    monkeypatch.setattr(device_decode, "decode_on_device", gpu_refuses)
    encoded, _ = split.__getitems__([0, 1, 2])
    on_cpu = real_decode(encoded.files(), torch.device("cpu"))
    for _ in range(2):
        images = split.normalise.decoded(encoded.files(), torch.device("meta"))
        assert [i.device.type for i in images] == ["meta"] * 3
        assert [i.shape for i in images] == [i.shape for i in on_cpu]
    assert split.normalise.batches_on_cpu == 2
    assert capsys.readouterr().err.count("meta refused a batch of JPEGs (nvJPEG: unsupported JPEG)") == 1
    # One item of the encoded split is a batch of one, as the loader would make it.
    one, label = split[1]
    assert len(one) == 1 and label.ndim == 0
    # Bytes no decoder takes: one line naming what each said.
    damaged = [torch.frombuffer(bytearray(b"\xff\xd8\xff\xe0 not a JPEG at all"), dtype=torch.uint8)]
    with pytest.raises(DatasetError, match=r"could not be decoded on meta \(nvJPEG: unsupported JPEG\) nor on the CPU"):
        split.normalise.decoded(damaged, torch.device("meta"))
    with pytest.raises(DatasetError, match="a JPEG of this batch could not be decoded: "):
        split.normalise.decoded(damaged, torch.device("cpu"))

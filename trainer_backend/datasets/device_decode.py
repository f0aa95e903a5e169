"""Decode a batch of JPEG files on the GPU: the loader workers read bytes, the device decodes.

    batch = EncodedImages(data, offsets)             # what a supervisor hands over (streaming.py, output "encoded")
    decode = DeviceJpegDecode(64, normalisation)
    images = decode(batch.to("cuda:0"))              # (N, 3, 64, 64) float32, normalised, on cuda:0

torchvision's ``decode_jpeg`` takes a list of 1-D uint8 CPU tensors and, with a CUDA ``device``,
decodes them all with nvJPEG in one call (its documented batched form), returning (3, H, W)
uint8 tensors on the device; here with a stream of its own current, so that nvJPEG never writes
into memory the training stream's queued work still reads (``decode_on_device``). Each is then
resized to the stored size exactly as the CPU decode does (``resize_unit_images``, rounded back
to 8 bits), and normalised with the same constants.
The pixels differ from libjpeg's by the decoders' rounding only, a level or two of 255; a JPEG
far larger than the stored size differs a little more, as the CPU decode shrinks it in libjpeg
first (``Image.draft``).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

from .decoded import resize_unit_images, to_uint8
from .errors import DatasetError
from .paths import open_checked


class EncodedImages:
    """A batch of files' bytes in one uint8 buffer, file ``i`` at ``data[offsets[i]:offsets[i + 1]]``.
    ``to(device)`` only names the device that decodes them: decode_jpeg reads its input on the CPU."""

    def __init__(self, data: torch.Tensor, offsets: torch.Tensor, device: torch.device | None = None):
        self.data, self.offsets, self.device = data, offsets, device

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def files(self) -> list[torch.Tensor]:
        bounds = self.offsets.tolist()
        return [self.data[start:end] for start, end in zip(bounds[:-1], bounds[1:])]

    def to(self, device, non_blocking: bool = False) -> EncodedImages:
        return EncodedImages(self.data, self.offsets, torch.device(device))

    def pin_memory(self, device=None) -> EncodedImages:
        """What the DataLoader's pin_memory calls on a batch it does not know: the bytes, pinned."""
        return EncodedImages(self.data.pin_memory(), self.offsets, self.device)


def decode_jpegs(files: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """torchvision's batched decode, as it stands: on a CUDA device its outputs come from the
    current stream's pool of memory."""
    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():
        # torchvision 0.29 marks its image codecs deprecated in favour of TorchCodec; they still work.
        warnings.simplefilter("ignore", DeprecationWarning)
        return decode_jpeg(files, mode=ImageReadMode.RGB, device=device)


# One stream per GPU for decoding, made on first use in the training process (a loader worker never decodes).
_decode_streams: dict[torch.device, torch.cuda.Stream] = {}


def decode_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _decode_streams:
        _decode_streams[device] = torch.cuda.Stream(device=device)
    return _decode_streams[device]


def decode_on_device(files: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """The files decoded on ``device``, safe to use on its current (training) stream.

    torchvision allocates the decoded images from the current stream's pool but has nvJPEG write
    them on a private stream that waits for nothing on the current one, and nvJPEG's hardware
    decoder writes when it is called, whatever is queued (pytorch/vision#9606,
    meta-pytorch/torchcodec#1634). Decoding on the training stream could therefore be handed
    memory that the previous step freed while its queued kernels (its backward) still read it,
    and overwrite live activations or gradients; no device-side wait can prevent a write that
    ignores the queue. So the decode runs with a stream of its own current: its outputs come from
    that stream's pool, whose blocks the caching allocator hands out again only when every use
    recorded on them (``record_stream``: the training stream's, below) has been seen finished
    from the host, and which no other work uses. The training stream then waits for the decode
    stream, as for any producer on another stream. The other way, waiting on the host for the
    training stream before each decode, is as safe but stalls every step: the host could not
    queue step k+1 while step k runs."""
    if device.type != "cuda":
        return decode_jpegs(files, device)
    training = torch.cuda.current_stream(device)
    decoding = decode_stream(device)
    with torch.cuda.stream(decoding):
        images = decode_jpegs(files, device)
    training.wait_stream(decoding)
    for image in images:
        image.record_stream(training)
    return images


class DeviceJpegDecode:
    """``EncodedImages`` -> the model's input on their device: decoded, resized to ``image_size``
    as stored pixels are, then normalised by ``normalisation`` (the stored pixels' own)."""

    def __init__(self, image_size: int, normalisation):
        self.image_size, self.normalisation = image_size, normalisation
        self.batches_on_cpu = 0  # batches the device refused, decoded on the CPU instead

    def stored_pixels(self, encoded: EncodedImages) -> torch.Tensor:
        """The batch as the CPU decode stores it: (N, 3, S, S) uint8, on the device."""
        size, device = self.image_size, encoded.device or torch.device("cpu")
        images = self.decoded(encoded.files(), device)
        rows_by_shape: dict[tuple[int, ...], list[int]] = {}
        for row, image in enumerate(images):
            rows_by_shape.setdefault(tuple(image.shape), []).append(row)
        stored: list[torch.Tensor] = [torch.empty(0)] * len(images)
        for shape, rows in rows_by_shape.items():  # one resize per size present (a photo folder: nearly one per image)
            group = torch.stack([images[row] for row in rows])
            if shape[-2:] != (size, size):
                group = to_uint8(resize_unit_images(group.float().div_(255.0), size))
            if len(rows) == len(images):
                return group
            for row, image in zip(rows, group):
                stored[row] = image
        # Put back in the batch's order by one stack on the device: rows scattered through an index
        # tensor would cost a blocking host-to-device copy per shape.
        return torch.stack(stored)

    def __call__(self, encoded: EncodedImages) -> torch.Tensor:
        return self.normalisation(self.stored_pixels(encoded))

    def decoded(self, files: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """The files decoded on ``device``; a batch it refuses (one file nvJPEG does not take:
        CMYK, 12-bit, a damaged file the first file's check could not foresee) is decoded on the
        CPU instead, and the run's log says so the first time."""
        try:
            return decode_on_device(files, device)
        except RuntimeError as device_error:
            if device.type == "cpu":
                raise DatasetError(f"a JPEG of this batch could not be decoded: {str(device_error)[:200]}") from None
            try:
                images = [image.to(device) for image in decode_on_device(files, torch.device("cpu"))]
            except RuntimeError as cpu_error:
                raise DatasetError(f"a JPEG of this batch could not be decoded on {device} "
                                   f"({str(device_error)[:200]}) nor on the CPU ({str(cpu_error)[:200]})") from None
            self.batches_on_cpu += 1
            if self.batches_on_cpu == 1:
                print(f"parallax: {device} refused a batch of JPEGs ({str(device_error)[:200]}); such batches "
                      "are decoded on the CPU", file=sys.stderr, flush=True)
            return images


def device_decode_problem(path: Path, roots, device: torch.device) -> str | None:
    """Why ``device`` cannot decode the JPEG at ``path`` (a torchvision built without nvJPEG, a
    driver that refuses it), or None when it can."""
    try:
        with open_checked(path, roots) as handle:
            raw = torch.frombuffer(bytearray(handle.read()), dtype=torch.uint8)
        decode_on_device([raw], device)
    except Exception as exc:  # whatever the decoder raises, the run falls back to the CPU and says why
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None

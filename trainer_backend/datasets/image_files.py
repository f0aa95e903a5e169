"""Decode one image file into resized pixels: read, pick bands, scale to [0, 1], resize.

TIFFs may carry any number of bands (Sentinel-2 has 13); PNG/JPEG/BMP files are read as RGB.
For a 13-band image the defaults follow EuroSAT: bands (3, 2, 1) = red, green, blue, divided by 4000.
A file is opened once, through ``paths.open_checked``, and what its header declares is checked
against ``limits.max_image_bytes`` (the decode's whole peak) before any pixel is decoded. A PNG/JPEG/BMP file is read whole in
one call (the decoders' many small reads then come from memory), and a JPEG much larger than the
size it is decoded for is decoded at 1/2, 1/4 or 1/8 scale by libjpeg itself (``Image.draft``),
still at least that size, before the resize the rest of the way. Any image at least four times
that size is then shrunk by a whole factor in its own dtype (PIL's ``reduce``, a box average;
``box_reduce`` for 16-bit and float pixels), so the float copy the resize works on is small.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tifffile
import torch
from PIL import Image

from contract.printable import shown_name
from trainer_backend.datasets.decoded import DatasetError, resize_unit_images, to_uint8
from trainer_backend.datasets.limits import max_image_bytes, reduction_factor, too_large_image
from trainer_backend.datasets.paths import open_checked

TIFF_SUFFIXES = (".tif", ".tiff")
RGB_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
IMAGE_SUFFIXES = TIFF_SUFFIXES + RGB_SUFFIXES
SENTINEL2_BANDS = 13
SENTINEL2_RGB = (3, 2, 1)
SENTINEL2_SCALE = 4000.0
# PIL keeps an 8-bit image of up to four bands in four bytes a pixel; a mode it cannot shrink
# (palette, CMYK, ...) is converted to RGB first, another four.
PIL_BYTES_PER_PIXEL = 4
# box_reduce makes float64 sums of this many input values at a time.
REDUCE_STRIP_VALUES = 2**20


@dataclass(frozen=True)
class DecodedImage:
    pixels: np.ndarray        # (C, S, S) uint8 (8-bit source at full scale) or float16 in [0, 1]
    native_size: tuple[int, int]


def is_image_file(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES


def read_band_last(path: Path, roots: list[Path] | None = None, draft_size: int | None = None) -> np.ndarray:
    """The file's pixels as (H, W, bands). Any failure names the file. With ``roots``, the file
    opened must lie inside them. With ``draft_size``, a JPEG may come back smaller than stored,
    never below ``draft_size`` on either side."""
    return read_with_size(path, roots, draft_size)[0]


def read_with_size(path: Path, roots: list[Path] | None = None,
                   draft_size: int | None = None) -> tuple[np.ndarray, tuple[int, int]]:
    """``read_band_last``'s pixels and the (height, width) the file stores."""
    with open_checked(path, roots) as handle:
        try:
            if path.suffix.lower() in TIFF_SUFFIXES:
                pixels = read_tiff(handle, path, draft_size)
                stored_size = pixels.shape[:2]
                pixels = box_reduce(pixels, reduction_factor(*stored_size, draft_size))
            else:
                # Read whole unless the file alone is over what one decoded image may take: then
                # the decoder reads its header from the file and refuses it before reading the rest.
                whole = os.fstat(handle.fileno()).st_size <= max_image_bytes()
                pixels, stored_size = read_rgb(io.BytesIO(handle.read()) if whole else handle, path, draft_size,
                                               os.fstat(handle.fileno()).st_size if whole else 0)
        except DatasetError:
            raise
        except Exception as exc:  # decoders raise many types; the user needs the file and the reason
            raise DatasetError(f"cannot read image {shown_name(path)}: {exc}") from exc
    if pixels.ndim != 3 or min(pixels.shape) == 0:
        raise DatasetError(f"cannot read image {shown_name(path)}: expected a 2-D image with bands, got shape {pixels.shape}")
    return pixels, (int(stored_size[0]), int(stored_size[1]))


def refuse_declared_size(path: Path, shape: tuple[int, ...], bytes_per_value: int, target: int | None = None,
                         decoder_bytes: int | None = None) -> None:
    problem = too_large_image(path, shape, bytes_per_value, target, decoder_bytes)
    if problem:
        raise DatasetError(problem)


def box_reduce(pixels: np.ndarray, factor: int) -> np.ndarray:
    """(H, W, bands) ``pixels`` averaged over ``factor`` x ``factor`` blocks, in their own dtype
    (integers rounded): a strip of rows at a time, so no float copy of the whole image is made."""
    if factor < 2:
        return pixels
    height, width, bands = pixels.shape[0] // factor, pixels.shape[1] // factor, pixels.shape[2]
    out = np.empty((height, width, bands), dtype=pixels.dtype)
    rows = max(1, REDUCE_STRIP_VALUES // max(1, factor * factor * width * bands))
    for start in range(0, height, rows):
        stop = min(height, start + rows)
        strip = pixels[start * factor:stop * factor, :width * factor].astype(np.float64)
        means = strip.reshape(stop - start, factor, width, factor, bands).mean(axis=(1, 3))
        if np.issubdtype(out.dtype, np.integer):
            means = np.rint(means, out=means)
        out[start:stop] = means
    return out


def read_tiff(handle, path: Path, target: int | None = None) -> np.ndarray:
    with tifffile.TiffFile(handle, name=path.name) as tiff:
        # The header declares the shape; a few kilobytes of tiles can declare tens of gigabytes.
        series = tiff.series[0]
        shape = tuple(series.shape)
        # Band-last for the cost: a planar file declares (bands, H, W).
        hwc = shape if len(shape) != 3 or shape[0] >= shape[-1] else (shape[1], shape[2], shape[0])
        refuse_declared_size(path, hwc if len(hwc) == 3 else (*hwc, 1), series.dtype.itemsize, target)
        pixels = tiff.asarray()
    if pixels.ndim == 2:
        return pixels[:, :, None]
    if pixels.ndim == 3 and pixels.shape[0] < pixels.shape[-1]:
        # Band-first (planar) TIFFs come back (bands, H, W); the band axis is the short one.
        return np.moveaxis(pixels, 0, -1)
    return pixels


def read_rgb(handle, path: Path, draft_size: int | None = None,
             encoded_bytes: int = 0) -> tuple[np.ndarray, tuple[int, int]]:
    """The pixels (H, W, 3) and the stored (height, width) of a PNG/JPEG/BMP file; ``encoded_bytes``
    is what of the file is held in memory while it is decoded (read whole), counted in its cost."""
    with Image.open(handle) as image:
        width, height = image.size  # from the header: nothing is decoded yet
        bands = max(3, len(image.getbands()))
        if draft_size is not None and image.format == "JPEG":
            # libjpeg scales in its inverse DCT, a fraction of a full decode's work; the result is
            # still draft_size or more on each side, and the antialiased resize takes it the rest.
            # Still nothing decoded: the size it will decode at is known, and that is what it costs.
            image.draft("RGB", (draft_size, draft_size))
        wide = image.mode in ("I", "F")
        bytes_per_value = 4 if wide else 2 if image.mode.startswith("I;16") else 1
        shrinkable = image.mode in ("RGB", "RGBA", "L", "LA")
        decoder_bytes = encoded_bytes + (height * width * bands * bytes_per_value if bytes_per_value > 1 else
                                         image.size[0] * image.size[1] * PIL_BYTES_PER_PIXEL * (1 if shrinkable else 2))
        if image.format == "JPEG" and image.info.get("progressive"):
            # libjpeg keeps a progressive file's every DCT coefficient (two bytes a value) at full size.
            decoder_bytes += height * width * bands * 2
        refuse_declared_size(path, (height, width, bands), bytes_per_value, draft_size, decoder_bytes)
        if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
            # 16-bit and float grayscale would be clipped to 8 bits by convert("RGB").
            gray = box_reduce(np.asarray(image)[:, :, None], reduction_factor(height, width, draft_size))
            return np.repeat(gray, 3, axis=2), (height, width)
        factor = reduction_factor(image.size[1], image.size[0], draft_size)
        if factor > 1:
            # A box average in uint8 inside PIL: the pixels taken out (and made float) are the shrunk ones.
            image = (image if shrinkable else image.convert("RGB")).reduce(factor)
        # An RGB image needs no convert, which would copy it.
        return np.asarray(image if image.mode == "RGB" else image.convert("RGB")), (height, width)


def default_bands(band_count: int, path: Path) -> tuple[int, ...]:
    if band_count == SENTINEL2_BANDS:
        return SENTINEL2_RGB
    if path.suffix.lower() in RGB_SUFFIXES:
        return tuple(range(min(band_count, 3)))
    return tuple(range(band_count))


def default_scale(dtype: np.dtype, band_count: int) -> float:
    if band_count == SENTINEL2_BANDS:
        return SENTINEL2_SCALE
    if np.issubdtype(dtype, np.integer):
        return float(np.iinfo(dtype).max)
    return 1.0


def select_bands(pixels: np.ndarray, bands: tuple[int, ...], path: Path) -> np.ndarray:
    band_count = pixels.shape[-1]
    for band in bands:
        if not 0 <= band < band_count:
            raise DatasetError(
                f"band index {band} is out of range for {path}: it has {band_count} bands "
                f"(valid indices 0..{band_count - 1})"
            )
    if tuple(bands) == tuple(range(band_count)):
        return pixels  # every band in order (RGB files): no copy
    return pixels[:, :, list(bands)]


def decode_image_file(path: Path, image_size: int, bands: tuple[int, ...] | None,
                      band_scale: float | None, roots: list[Path] | None = None) -> DecodedImage:
    """Read ``path`` and return its chosen bands, divided by the scale, clipped to [0, 1], resized.
    An 8-bit image already at the size comes back as a (C, S, S) view of the decoded (S, S, C)
    pixels, not a copy: its reader copies it once, into a batch or the cache."""
    pixels, native_size = read_with_size(path, roots, draft_size=image_size)
    band_count = pixels.shape[-1]
    chosen = select_bands(pixels, bands if bands is not None else default_bands(band_count, path), path)
    scale = band_scale if band_scale is not None else default_scale(pixels.dtype, band_count)
    if pixels.dtype == np.uint8 and scale == 255.0 and pixels.shape[:2] == (image_size, image_size):
        # An 8-bit image already at the stored size: the float round trip below would give these same bytes.
        return DecodedImage(chosen.transpose(2, 0, 1), native_size)
    unit = torch.from_numpy(chosen.astype(np.float32)).permute(2, 0, 1).div_(scale).clamp_(0.0, 1.0)
    unit.nan_to_num_(0.0)  # float rasters mark no-data with NaN, which would poison the channel mean
    resized = resize_unit_images(unit[None], image_size)[0]
    # 8-bit sources at their full scale lose nothing when stored back as uint8, at half float16's size.
    stays_8bit = pixels.dtype == np.uint8 and scale == 255.0
    stored = to_uint8(resized) if stays_8bit else resized.half()
    return DecodedImage(stored.numpy(), native_size)


def describe_image_file(path: Path, roots: list[Path] | None = None) -> dict:
    """Native shape, dtype and default band choice of one file, for a quick look at a dataset."""
    pixels = read_band_last(path, roots)
    height, width, band_count = pixels.shape
    return {
        "image_shape": (height, width),
        "bands": band_count,
        "dtype": str(pixels.dtype),
        "default_bands": default_bands(band_count, path),
        "default_scale": default_scale(pixels.dtype, band_count),
    }

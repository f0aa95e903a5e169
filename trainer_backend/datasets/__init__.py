"""Datasets for Parallax training: built-in sets and image folders, decoded once, cached and split.

    from trainer_backend.datasets import prepare_data, collate_batch
    data = prepare_data("digits", image_size=32)               # or "mnist", "cifar10", "/data/EuroSAT_MS"
    loader = DataLoader(data.train, batch_size=64, shuffle=True, collate_fn=collate_batch)
    print(data.info.num_classes, data.info.in_chans, data.info.warnings)
    images = data.train.normalise(pixels.to(device))           # batches come as stored (uint8/float16)

A folder holds one sub-folder per class. Multi-band TIFFs (e.g. 13-band Sentinel-2 EuroSAT) default
to bands (3, 2, 1) divided by 4000; PNG/JPEG/BMP files are read as RGB. Decoded sets are cached
under ``data_dir()/cache`` as one file that every process maps read-only (cache.py); a changed
file makes a new cache entry. ``prepare_data(..., decode="workers")`` caches nothing and decodes
a folder's files in the loader workers instead (streaming.py), or, on a CUDA run over JPEGs, on
the GPU from the bytes the workers read (device_decode.py).
"""

import importlib

# Imported on first use: a check before launch (limits, paths) reads a submodule, and must not
# pay for torch through this package.
_HOMES = {
    "BUILTIN_DATASETS": ".builtin",
    "DatasetError": ".errors",
    "DatasetInfo": ".prepare",
    "DEVICE_DATA_SHARE": ".tensor_dataset",
    "ImageTensorDataset": ".tensor_dataset",
    "LabelsOnly": ".labels_only",
    "PreparedData": ".prepare",
    "collate_batch": ".tensor_dataset",
    "inspect_dataset": ".prepare",
    "kept_on_device": ".tensor_dataset",
    "prepare_data": ".prepare",
    "stored_split_size": ".prepare",
}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name], __name__), name)


__all__ = [
    "BUILTIN_DATASETS",
    "DEVICE_DATA_SHARE",
    "DatasetError",
    "DatasetInfo",
    "ImageTensorDataset",
    "LabelsOnly",
    "PreparedData",
    "collate_batch",
    "inspect_dataset",
    "kept_on_device",
    "prepare_data",
    "stored_split_size",
]

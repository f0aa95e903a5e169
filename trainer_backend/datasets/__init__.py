"""Datasets for Parallax training: built-in sets and image folders, decoded once, cached and split.

    from trainer_backend.datasets import prepare_data, collate_batch
    data = prepare_data("digits", image_size=32)               # or "mnist", "cifar10", "/data/EuroSAT_MS"
    loader = DataLoader(data.train, batch_size=64, shuffle=True, collate_fn=collate_batch)
    print(data.info.num_classes, data.info.in_chans, data.info.warnings)
    images = data.train.normalise(pixels.to(device))           # batches come as stored (uint8/float16)

A folder holds one sub-folder per class. Multi-band TIFFs (e.g. 13-band Sentinel-2 EuroSAT) default
to bands (3, 2, 1) divided by 4000; PNG/JPEG/BMP files are read as RGB. Decoded sets are cached
under ``data_dir()/cache``; a changed file makes a new cache entry.
"""

from .base import DatasetError
from .builtin import BUILTIN_DATASETS
from .prepare import DatasetInfo, PreparedData, inspect_dataset, prepare_data
from .tensor_dataset import ImageTensorDataset, collate_batch

__all__ = [
    "BUILTIN_DATASETS",
    "DatasetError",
    "DatasetInfo",
    "ImageTensorDataset",
    "PreparedData",
    "collate_batch",
    "inspect_dataset",
    "prepare_data",
]

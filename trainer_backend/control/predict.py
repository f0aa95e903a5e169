"""Use a run's best checkpoint on image files, with the run's own preprocessing.

    python -m trainer_backend predict 7 photo1.png photo2.jpg     # a class and its probability per file
    python -m trainer_backend predict 7 --folder holdout/         # accuracy on a folder of class sub-folders

best.pt holds what this needs (``trainer.checkpoint_payload``): the weights, the model's name and every
argument it was built with, the class names and the preprocessing. The model is built again as the run built
it (``models.create_model``: its arguments, the dataset's classes and channels). Each file is made what the
run trained on: decoded as the run's dataset was (``decode_image_file``: bands, scale, resize to the stored
size), turned into the run's channels (an RGB photo made grey, ITU-R 601 luma, for a 1-channel run such as
digits; a grey one repeated for a 3-channel run), normalised with the training images' mean and std, and
centre-cropped to the training size where the run stored larger images: what validation did to its images.
``changes()`` says in one line what that changed. One process, on the CPU, in evaluation mode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from contract.model_source import ModelError, is_custom_model, model_source
from trainer_backend.datasets.errors import DatasetError
from trainer_backend.datasets.folder import list_image_folder, resolve_folder
from trainer_backend.datasets.image_files import decode_image_file
from trainer_backend.datasets.tensor_dataset import Normalisation
from trainer_backend.rank.augment import centre_crop
from trainer_backend.rank.checkpoint_read import read_checkpoint
from trainer_backend.rank.models import create_model

# Files decoded and classified together: bounded memory whatever the folder's size.
BATCH_FILES = 64
NEEDED_KEYS = ("model", "model_name", "model_kwargs", "class_names", "preprocessing")
SIZES = ("num_classes", "in_chans")  # the dataset's, passed by create_model: not model arguments of the user's
GREY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601 luma, as PIL's convert("L") and torchvision's Grayscale


def weights_do_not_fit(run_id: int, payload: dict, exc: RuntimeError) -> str:
    """Why run ``run_id``'s weights do not load into the model built from its checkpoint now: for your own
    model, mostly its file edited since the run trained it (the run recorded its SHA-256)."""
    name = payload["model_name"]
    recorded = (payload.get("config") or {}).get("model_source") or ""
    why = ""
    if recorded and is_custom_model(name):
        try:
            now = model_source(name)
        except ModelError:
            now = ""
        if now != recorded:
            path, _, digest = recorded.rpartition(" ")
            why = (f": {path} changed since the run trained it (recorded {digest}, now "
                   f"{now.rpartition(' ')[2] or 'missing'}); put back the file the run trained to use its weights")
    detail = " ".join(str(exc).split())
    return (f"run {run_id}'s weights do not fit the model {name!r} builds now "
            f"({detail[:300]}{'…' if len(detail) > 300 else ''}){why}")


@dataclass(frozen=True)
class Prediction:
    path: Path
    class_name: str
    probability: float


class Predictor:
    """A checkpoint's model, ready to classify image files."""

    def __init__(self, checkpoint_path: Path, run_id: int):
        payload = read_checkpoint(checkpoint_path, f"run {run_id}'s checkpoint",
                                  "it cannot be used; train the run again (or put back a copy of the file)")
        missing = [key for key in NEEDED_KEYS if key not in payload]
        if missing:
            raise ValueError(f"run {run_id}'s checkpoint {checkpoint_path} lacks {', '.join(missing)}: it was written "
                             "by an older Parallax, before checkpoints held their preprocessing; train the run again")
        self.class_names = list(payload["class_names"])
        self.prep = payload["preprocessing"]
        kwargs = payload["model_kwargs"]
        self.in_chans = len(self.prep["mean"])
        # Every argument the model was built with: the checkpoint's, and the run's own model_args (checkpoints
        # written before they held them kept only the sizes).
        model_args = {**json.loads((payload.get("config") or {}).get("model_args") or "{}"),
                      **{key: value for key, value in kwargs.items() if key not in SIZES}}
        self.model = create_model(payload["model_name"], num_classes=len(self.class_names), in_chans=self.in_chans,
                                  model_args=model_args)
        try:
            self.model.load_state_dict(payload["model"])
        except RuntimeError as exc:  # the model built now is not the one trained: name why, in one line
            raise ValueError(weights_do_not_fit(run_id, payload, exc)) from None
        self.model.eval()
        mean, std = torch.tensor(self.prep["mean"]), torch.tensor(self.prep["std"])
        self._normalise = {dtype: Normalisation(mean, std, stored_dtype=dtype) for dtype in (torch.uint8, torch.float16)}
        self._changed_channels: set[int] = set()  # the channel counts files had before they were made the run's
        self._native_sizes: set[tuple[int, int]] = set()

    def inputs(self, paths: list[Path]) -> torch.Tensor:
        """The model's input for ``paths``, as validation made it."""
        bands = tuple(self.prep["bands"]) if self.prep.get("bands") is not None else None
        rows = []
        for path in paths:
            decoded_image = decode_image_file(path, int(self.prep["stored_size"]), bands, self.prep.get("band_scale"))
            self._native_sizes.add(decoded_image.native_size)
            decoded = self.to_run_channels(torch.from_numpy(decoded_image.pixels.copy()), path)
            rows.append(self._normalise[decoded.dtype](decoded[None]))
        images = torch.cat(rows)
        if int(self.prep["stored_size"]) > int(self.prep["image_size"]):
            images = centre_crop(images, int(self.prep["image_size"]))
        return images

    def to_run_channels(self, decoded: torch.Tensor, path: Path) -> torch.Tensor:
        """``decoded`` (C, S, S) with the run's channels: RGB made grey for a 1-channel run, grey repeated for a
        3-channel one; any other difference is refused, naming the file."""
        channels = decoded.shape[0]
        if channels == self.in_chans:
            return decoded
        self._changed_channels.add(channels)
        if channels == 3 and self.in_chans == 1:
            weights = torch.tensor(GREY_WEIGHTS).view(3, 1, 1)
            grey = (decoded.float() * weights).sum(dim=0, keepdim=True)
            return grey.round().clamp(0, 255).to(torch.uint8) if decoded.dtype == torch.uint8 else grey.to(decoded.dtype)
        if channels == 1:
            return decoded.expand(self.in_chans, -1, -1).contiguous()
        raise ValueError(f"image {path} has {channels} channel(s) after decoding, the run's model takes "
                         f"{self.in_chans}: give images like the run's dataset (or choose its bands as the run did)")

    def changes(self) -> str:
        """One line: what was done to the files classified so far to make them what the run trained on."""
        stored, size = int(self.prep["stored_size"]), int(self.prep["image_size"])
        said = []
        if self._changed_channels:
            had = "/".join(str(c) for c in sorted(self._changed_channels))
            said.append(f"{had}-channel images made {self.in_chans}-channel "
                        f"({'grey, ITU-R 601 luma' if self.in_chans == 1 else 'the grey channel repeated'}) as the "
                        "run's were")
        natives = sorted(self._native_sizes)
        if natives and natives != [(stored, stored)]:
            shown_sizes = ", ".join(f"{w}x{h}" for h, w in natives[:3]) + (", …" if len(natives) > 3 else "")
            said.append(f"resized from {shown_sizes} to {stored}x{stored}")
        if stored > size:
            said.append(f"centre-cropped to {size}x{size}")
        mean = ", ".join(f"{v:.3f}" for v in self.prep["mean"])
        std = ", ".join(f"{v:.3f}" for v in self.prep["std"])
        said.append(f"normalised with the training images' mean ({mean}) and std ({std})")
        return "predict: " + "; ".join(said)

    @torch.no_grad()
    def probabilities(self, paths: list[Path]) -> torch.Tensor:
        """(len(paths), classes) softmax probabilities, a batch of files at a time."""
        parts = [torch.softmax(self.model(self.inputs(paths[i:i + BATCH_FILES])).float(), dim=1)
                 for i in range(0, len(paths), BATCH_FILES)]
        return torch.cat(parts) if parts else torch.empty(0, len(self.class_names))

    def predict(self, paths: list[Path]) -> list[Prediction]:
        for path in paths:
            if not path.is_file():
                raise FileNotFoundError(f"image {path} is not a file: give image files (or --folder FOLDER)")
        best, index = self.probabilities(paths).max(dim=1) if paths else (torch.empty(0), torch.empty(0))
        return [Prediction(path, self.class_names[int(i)], float(p)) for path, p, i in zip(paths, best, index)]

    def folder_accuracy(self, folder: str) -> tuple[float, int, dict[str, float]]:
        """(accuracy, images, accuracy per class) over a folder with one sub-folder per class, named as the
        run's classes (a sub-folder the run never saw is refused, naming it)."""
        listing = list_image_folder(resolve_folder(folder))
        unknown = [name for name in listing.class_names if name not in self.class_names]
        if unknown:
            raise DatasetError(f"--folder {listing.root} has class folder(s) {', '.join(unknown)} the run was not "
                               f"trained on: its classes are {', '.join(self.class_names)}")
        paths = [path for files in listing.files_by_class for path in files]
        labels = torch.tensor([self.class_names.index(name) for name, files in zip(listing.class_names,
                                                                                  listing.files_by_class)
                               for _ in files], dtype=torch.long)
        if not paths:
            raise DatasetError(f"--folder {listing.root} holds no image files in its class folders")
        predicted = self.probabilities(paths).argmax(dim=1)
        per_class = {name: float((predicted[labels == i] == i).float().mean())
                     for i, name in enumerate(self.class_names) if bool((labels == i).any())}
        return float((predicted == labels).float().mean()), len(paths), per_class

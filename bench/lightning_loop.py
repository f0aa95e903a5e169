"""The same training as bench/plain_loop.py, written for PyTorch Lightning's Trainer on CPU.

A LightningModule around timm resnet18 (training_step, validation_step, Adam), the same digits
split and loaders, ``lightning.Trainer(accelerator="cpu", devices=1)`` with logging to the
progress bar, checkpoints, the model summary and the sanity check switched off, so that the
Trainer does the training and the validation, and nothing else. Metrics are logged per epoch
with ``self.log``, as a Lightning user would.

    python bench/lightning_loop.py --epochs 3 --batch-size 128

Prints one JSON line with each epoch's train_time_s (first training batch fetched to last
training step done) and images_per_s (training images / train_time_s).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_loop import build_model, load_digits_split  # noqa: E402

from torch.utils.data import DataLoader  # noqa: E402


class DigitsClassifier(L.LightningModule):
    def __init__(self, model_name: str, lr: float):
        super().__init__()
        self.model = build_model(model_name)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        images, labels = batch
        logits = self.model(images)
        loss = F.cross_entropy(logits, labels)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        logits = self.model(images)
        self.log("val_loss", F.cross_entropy(logits, labels), on_epoch=True)
        self.log("val_acc", (logits.argmax(1) == labels).float().mean(), on_epoch=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class TrainTimer(L.Callback):
    """Training time per epoch, measured like Parallax's: the loop over the training batches."""

    def __init__(self) -> None:
        self.epochs: list[dict] = []

    def on_train_epoch_start(self, trainer, module) -> None:
        self._start, self._last, self._images = time.perf_counter(), None, 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self._images += len(batch[1])
        self._last = time.perf_counter()

    def on_train_epoch_end(self, trainer, module) -> None:
        seconds = self._last - self._start
        self.epochs.append({"epoch": len(self.epochs) + 1, "train_time_s": seconds,
                            "images_per_s": self._images / seconds,
                            "val_acc": float(trainer.callback_metrics.get("val_acc", float("nan")))})


def main() -> None:
    parser = argparse.ArgumentParser(description="Lightning Trainer: resnet18 on digits")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    # Lightning suggests more loader workers for in-memory tensors; that is not what is compared.
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    torch.manual_seed(args.seed)
    train_set, val_set = load_digits_split(args.image_size, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(args.seed))
    val_loader = DataLoader(val_set, batch_size=args.batch_size)
    timer = TrainTimer()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=args.epochs, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[timer])
    trainer.fit(DigitsClassifier(args.model, args.lr), train_loader, val_loader)
    print(json.dumps({"threads": torch.get_num_threads(), "lightning": L.__version__, "epochs": timer.epochs}),
          flush=True)


if __name__ == "__main__":
    main()

"""A hand-written PyTorch training loop: the baseline Parallax's overhead is measured against.

It does the work of ``python -m trainer_backend run --dataset digits --model resnet18 --batch-size 128``:
scikit-learn's digits upsampled to 32x32, a stratified 80/20 split (seed 0), normalised with the
training images' mean and std, timm resnet18 from scratch, Adam (lr 1e-3), shuffled batches, and
validation after every epoch, with torch's default thread count, as a user would write it.

    python bench/plain_loop.py --epochs 3 --batch-size 128

Prints a line per epoch and, last, one JSON line with each epoch's train_time_s (the training
loop, data loading included), images_per_s (training images / train_time_s), epoch_time_s
(training and validation), val_acc, and the torch thread count.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import timm
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset


def load_digits_split(image_size: int = 32, val_fraction: float = 0.2, seed: int = 0):
    """(train, val) TensorDatasets of normalised 1 x S x S digits, split stratified by class."""
    digits = load_digits()
    pixels = torch.from_numpy(digits.images).float().div(16.0).unsqueeze(1)  # 0..16 intensities
    pixels = F.interpolate(pixels, size=(image_size, image_size), mode="bilinear", antialias=True,
                           align_corners=False).clamp(0.0, 1.0)
    labels = torch.from_numpy(digits.target).long()
    train_idx, val_idx = train_test_split(np.arange(len(labels)), test_size=val_fraction,
                                          random_state=seed, stratify=digits.target)
    train_x, val_x = pixels[train_idx], pixels[val_idx]
    mean, std = train_x.mean(), train_x.std()
    return (TensorDataset((train_x - mean) / std, labels[train_idx]),
            TensorDataset((val_x - mean) / std, labels[val_idx]))


def build_model(name: str = "resnet18", num_classes: int = 10, in_chans: int = 1) -> torch.nn.Module:
    return timm.create_model(name, num_classes=num_classes, in_chans=in_chans)


def train_step(model, images, labels, optimizer) -> tuple[float, int]:
    """One optimisation step; returns the batch's summed loss and its correct predictions."""
    logits = model(images)
    loss = F.cross_entropy(logits, labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item() * len(labels), (logits.argmax(1) == labels).sum().item()


def train_epoch(model, loader, optimizer) -> tuple[float, float, int]:
    model.train()
    loss_sum, correct, seen = 0.0, 0, 0
    for images, labels in loader:
        batch_loss, batch_correct = train_step(model, images, labels, optimizer)
        loss_sum += batch_loss
        correct += batch_correct
        seen += len(labels)
    return loss_sum / seen, correct / seen, seen


@torch.no_grad()
def validate(model, loader) -> tuple[float, float]:
    model.eval()
    loss_sum, correct, seen = 0.0, 0, 0
    for images, labels in loader:
        logits = model(images)
        loss_sum += F.cross_entropy(logits, labels).item() * len(labels)
        correct += (logits.argmax(1) == labels).sum().item()
        seen += len(labels)
    return loss_sum / seen, correct / seen


def main() -> None:
    parser = argparse.ArgumentParser(description="Plain PyTorch loop: resnet18 on digits")
    parser.add_argument("--model", default="resnet18", help="timm model name (default resnet18)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(args.seed)
    train_set, val_set = load_digits_split(args.image_size, seed=args.seed)
    model = build_model(args.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(args.seed))
    val_loader = DataLoader(val_set, batch_size=args.batch_size)

    epochs = []
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        train_loss, train_acc, seen = train_epoch(model, train_loader, optimizer)
        train_time_s = time.perf_counter() - start
        val_loss, val_acc = validate(model, val_loader)
        epoch_time_s = time.perf_counter() - start
        epochs.append({"epoch": epoch, "train_loss": train_loss, "train_acc": train_acc, "val_loss": val_loss,
                       "val_acc": val_acc, "train_time_s": train_time_s, "epoch_time_s": epoch_time_s,
                       "images_per_s": seen / train_time_s})
        print(f"epoch {epoch}/{args.epochs}  train_loss {train_loss:.4f}  val_acc {val_acc:.4f}  "
              f"{seen / train_time_s:.0f} img/s  {epoch_time_s:.1f} s", flush=True)
    print(json.dumps({"threads": torch.get_num_threads(), "epochs": epochs}), flush=True)


if __name__ == "__main__":
    main()

"""The network the test plugins train: one convolution and a linear head, small enough that a step
costs almost nothing; each plugin adds the behaviour it is about (failing, hanging, sleeping)."""

from __future__ import annotations

from torch import nn


class TinyNet(nn.Module):
    def __init__(self, num_classes: int = 10, in_chans: int = 3, **_):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_chans, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.head(self.body(x))

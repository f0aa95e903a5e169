"""The source of a user's own network, as a person would write it in a file outside the checkout: the tests
of ``--model path/file.py:Attr`` write it (and what each adds) into a folder of their own."""

NET_SOURCE = """
from torch import nn


class Net(nn.Module):
    def __init__(self, width, num_classes=10, in_chans=3):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(in_chans, width, 3, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(self.features(x))
"""

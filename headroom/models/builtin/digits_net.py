"""The digits network: a small CNN over 8x8 images that outputs class probabilities."""

from __future__ import annotations

import torch
from torch import nn

NUM_CLASSES = 10  # digits 0..9


class DigitsNet(nn.Module):
    """conv3x3(1->c) -> ReLU -> conv3x3(c->2c) -> ReLU -> maxpool2 -> fc(hidden) -> ReLU -> fc(10) -> softmax."""

    def __init__(self, channels: int = 32, hidden: int = 128) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(2 * channels * 4 * 4, hidden),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(hidden, NUM_CLASSES),
        )

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Unnormalised scores [N, 10] for input [N, 1, 8, 8] (training uses these)."""
        out: torch.Tensor = self.classifier(self.features(x))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Probabilities [N, 10] (what is exported and served)."""
        return torch.softmax(self.logits(x), dim=-1)

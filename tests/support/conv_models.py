"""Convolutional ``package.module:function`` models for the QNN tests of issue 23 (classes 3, 4):
`pointwise_and_spatial` has what LPBQ blocks (a 1x1 convolution and a linear, 32 input
channels each) beside what it leaves per channel (a 3x3 convolution)."""

from __future__ import annotations

import torch
from torch import nn


class PointwiseAndSpatial(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.spatial = nn.Conv2d(32, 32, 3, padding=1)
        self.pointwise = nn.Conv2d(32, 16, 1)
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pointwise(torch.relu(self.spatial(x)))  # [1, 16, 4, 8]
        out: torch.Tensor = self.head(y.reshape(1, 16, 32))
        return out


def pointwise_and_spatial() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(23)
    x = torch.randn(1, 32, 4, 8, generator=torch.Generator().manual_seed(3))
    return PointwiseAndSpatial().eval(), (x,)


class SharedWeight(nn.Module):
    """A 1x1 convolution's weight used again, reshaped, as a linear's (issue 23, class 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        linear = nn.functional.linear(y, self.conv.weight.reshape(8, 8))
        out: torch.Tensor = self.conv(x).mean((2, 3)) + linear
        return out


def shared_weight() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(23)
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(1, 8, 4, 4, generator=g), torch.randn(1, 8, generator=g)
    return SharedWeight().eval(), (x, y)

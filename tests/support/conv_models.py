"""Convolutional ``package.module:function`` models for the QNN LPBQ tests (issue 23, class 3):
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
        return self.head(y.reshape(1, 16, 32))


def pointwise_and_spatial() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(23)
    x = torch.randn(1, 32, 4, 8, generator=torch.Generator().manual_seed(3))
    return PointwiseAndSpatial().eval(), (x,)

"""Small models in shapes the plain upstream QNN calls run, as ``package.module:function`` models:
attention whose mask is built from constants, sampling on a grid computed from the input, and a
truncation written as a cast to int and back."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as fn


class CausalAttention(nn.Module):
    """One self-attention block with `is_causal` sdpa: QNN's decomposition builds the causal
    mask from `arange`, a comparison and -inf."""

    def __init__(self, width: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = (
            t.reshape(b, s, self.heads, w // self.heads).transpose(1, 2)
            for t in self.qkv(x).chunk(3, -1)
        )
        y = fn.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.out(y.transpose(1, 2).reshape(b, s, w))
        return out


class AffineSample(nn.Module):
    """A 1x1 conv, then sampling its output on an affine grid whose transform a linear layer
    predicts from it (a spatial transformer): `affine_grid` builds its base grid from literals."""

    def __init__(self, channels: int = 4, size: int = 8) -> None:
        super().__init__()
        self.size = size
        self.conv = nn.Conv2d(channels, channels, 1)
        self.theta = nn.Linear(channels, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        identity = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        theta = 0.3 * self.theta(y.mean((2, 3))).reshape(-1, 2, 3) + identity
        grid = fn.affine_grid(theta, [x.shape[0], x.shape[1], self.size, self.size],
                              align_corners=False)
        return fn.grid_sample(y, grid, align_corners=False)


class Truncating(nn.Module):
    """A linear whose output is truncated to whole steps of 1/4 by a cast to int32 and back (a
    round trip QNN's preprocess fuses away: `qnn_compile.int_casts`)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = (self.linear(x) * 4).to(torch.int32).to(torch.float32)
        out: torch.Tensor = steps / 4 + x
        return out


def causal_attention() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(23)
    generator = torch.Generator().manual_seed(5)
    return CausalAttention().eval(), (torch.randn(1, 16, 32, generator=generator),)


def affine_sample() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(23)
    generator = torch.Generator().manual_seed(5)
    return AffineSample().eval(), (torch.randn(2, 4, 8, 8, generator=generator),)


def truncating() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(23)
    generator = torch.Generator().manual_seed(5)
    return Truncating().eval(), (3 * torch.randn(4, 16, generator=generator),)

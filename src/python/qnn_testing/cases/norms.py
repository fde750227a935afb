"""Normalization: batch / layer / group / instance / RMS norm, with and without affine."""

from __future__ import annotations

import torch
from torch import nn

from qnn_common.errors import StageError
from qnn_testing.cases.base import OpCase, Then, mod_case, randn, with_stats
from qnn_testing.expect import Raises, Rule

F = "norm"


class _ConvNorm(nn.Module):
    """A 1x1 conv into a norm: the norm then reads a quantized activation (and XNNPACK fuses
    batch norm into the conv, its usual pattern)."""

    def __init__(self, norm: nn.Module, dims: int = 2) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 1) if dims == 1 else nn.Conv2d(4, 4, 1)
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(self.conv(x))
        return out


# QNN cannot build the V68 (SM8350) context for 16-bit-activation layer norm: it logs "could
# not create op" on its dequantize, then graph prepare fails (measured at 16a8w).
LAYER_NORM_V68 = Rule(
    "qnn-v68",
    "16a8w",
    outcome=Raises(
        StageError,
        "QNN cannot build 16a8w layer_norm for V68",
        match="Failed to generate Qnn context binary",
    ),
)

x2 = randn((1, 4, 8, 8))
seq = randn((2, 8, 16))

CASES: tuple[OpCase, ...] = (
    mod_case(
        "batch_norm1d",
        F,
        lambda: _ConvNorm(with_stats(nn.BatchNorm1d(4)), dims=1),
        randn((2, 4, 16)),
    ),
    mod_case("batch_norm2d", F, lambda: _ConvNorm(with_stats(nn.BatchNorm2d(4))), x2, smoke=True),
    mod_case(
        "batch_norm2d_no_affine",
        F,
        lambda: _ConvNorm(with_stats(nn.BatchNorm2d(4, affine=False))),
        x2,
    ),
    mod_case(
        "layer_norm",
        F,
        lambda: Then(nn.LayerNorm(16)),
        seq,
        linear=True,
        smoke=True,
        qnn=True,
        rules=(LAYER_NORM_V68,),
    ),
    mod_case(
        "layer_norm_no_affine",
        F,
        lambda: Then(nn.LayerNorm(16, elementwise_affine=False)),
        seq,
        linear=True,
    ),
    mod_case("group_norm", F, lambda: _ConvNorm(nn.GroupNorm(2, 4)), x2),
    mod_case("instance_norm2d", F, lambda: _ConvNorm(nn.InstanceNorm2d(4)), x2),
    mod_case("instance_norm2d_affine", F, lambda: _ConvNorm(nn.InstanceNorm2d(4, affine=True)), x2),
    mod_case("rms_norm", F, lambda: Then(nn.RMSNorm(16)), seq, linear=True),
    mod_case(
        "rms_norm_no_affine",
        F,
        lambda: Then(nn.RMSNorm(16, elementwise_affine=False)),
        seq,
        linear=True,
    ),
)

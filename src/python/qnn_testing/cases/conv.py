"""Convolutions: 1-D, 2-D, 3-D and transposed, with stride, dilation, groups, padding, no bias,
and fused relu / batch norm."""

from __future__ import annotations

import torch
from torch import nn

from qnn_common.errors import StageError
from qnn_testing.cases.base import OpCase, mod_case, on_host, randn, with_stats
from qnn_testing.expect import Raises

F = "conv"


class _ConvBnRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.bn = with_stats(nn.BatchNorm2d(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


# ExecuTorch 1.5.1's host runtime refuses 3-D (transposed) convolution at execution with
# InvalidArgument (0x12); it lowers, so only running shows it.
CONV3D_HOST = on_host(
    Raises(
        StageError,
        "the host runtime's 3-D convolution fails with InvalidArgument",
        match="failed with error",
    )
)

x1 = randn((1, 4, 32))
x2 = randn((1, 4, 16, 16))
x3 = randn((1, 4, 6, 8, 8))

CASES: tuple[OpCase, ...] = (
    mod_case("conv1d", F, lambda: nn.Conv1d(4, 8, 3), x1, smoke=True),
    mod_case("conv1d_stride_dilation", F, lambda: nn.Conv1d(4, 8, 3, stride=2, dilation=2), x1),
    mod_case("conv2d", F, lambda: nn.Conv2d(4, 8, 3, padding=1), x2, smoke=True, qnn=True),
    mod_case("conv2d_stride2", F, lambda: nn.Conv2d(4, 8, 3, stride=2), x2),
    mod_case("conv2d_dilation", F, lambda: nn.Conv2d(4, 8, 3, dilation=2), x2),
    mod_case("conv2d_groups", F, lambda: nn.Conv2d(4, 8, 3, groups=2, padding=1), x2),
    mod_case("conv2d_depthwise", F, lambda: nn.Conv2d(4, 4, 3, groups=4, padding=1), x2),
    mod_case("conv2d_1x1", F, lambda: nn.Conv2d(4, 8, 1), x2),
    mod_case("conv2d_bn_relu", F, _ConvBnRelu, x2),
    mod_case("conv3d", F, lambda: nn.Conv3d(4, 4, 3, padding=1), x3, rules=CONV3D_HOST),
    mod_case("conv_transpose1d", F, lambda: nn.ConvTranspose1d(4, 8, 3, stride=2), x1),
    mod_case("conv_transpose2d", F, lambda: nn.ConvTranspose2d(4, 8, 3), x2),
    mod_case("conv_transpose2d_stride2", F, lambda: nn.ConvTranspose2d(4, 8, 2, stride=2), x2),
    mod_case(
        "conv_transpose3d",
        F,
        lambda: nn.ConvTranspose3d(4, 4, 2, stride=2),
        x3,
        rules=CONV3D_HOST,
    ),
)

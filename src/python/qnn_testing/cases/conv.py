"""Convolutions: 1-D, 2-D, 3-D and transposed, with stride, dilation, groups, padding, no bias,
and fused relu / batch norm."""

from __future__ import annotations

import torch
from torch import nn

from qnn_common.errors import BackendNotAvailableError
from qnn_testing.cases.base import (
    OpCase,
    mod_case,
    nothing_to_quantize,
    on_host,
    qnn_lowering_fails,
    randn,
    with_stats,
)
from qnn_testing.expect import Raises

F = "conv"


class _ConvBnRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.bn = with_stats(nn.BatchNorm2d(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


# ExecuTorch 1.5.1's portable convolution refuses 5-D tensors at run time (InvalidArgument).
# A 3-D convolution is rewritten into 2-D ones (qnn_compile.decompositions) and runs; XNNPACK's
# quantizer does not annotate it, so 8a8w has nothing to quantize and is refused.
CONV3D_HOST = nothing_to_quantize("conv3d")
# The 3-D transposed convolution has no rewrite: the compile stops, naming it, instead of the
# runtime failing (it used to lower, then fail with InvalidArgument when run).
CONV_TRANSPOSE3D_HOST = on_host(
    Raises(
        BackendNotAvailableError,
        "the portable convolution refuses 5-D tensors; no rewrite for the transposed 3-D one",
        match="refuses 5-D inputs",
    )
)

# QNN cannot build a V75 context for quantized 3-D ops at 16a16w ("Op Dequantize does not support
# per-channel quant tensor": the conv3d / conv_transpose3d weights) or 16a4w ("... could not
# create op": the conv, and max_pool3d's pooling); fp16 and 8a8w build and match (measured on
# conv3d, conv_transpose3d and the 3-D cases with a conv3d in front: pools, grid_sample_3d).
_CONV3D_BUILD = "Failed to generate Qnn context binary"
CONV3D_QNN = (
    qnn_lowering_fails(
        "16a16w", "QNN refuses a 16a16w 3-D conv's per-channel dequantize", _CONV3D_BUILD
    ),
    qnn_lowering_fails("16a4w", "QNN cannot create 16a4w 3-D conv / pool ops", _CONV3D_BUILD),
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
    mod_case(
        "conv3d", F, lambda: nn.Conv3d(4, 4, 3, padding=1), x3, rules=(*CONV3D_HOST, *CONV3D_QNN)
    ),
    mod_case("conv_transpose1d", F, lambda: nn.ConvTranspose1d(4, 8, 3, stride=2), x1),
    mod_case("conv_transpose2d", F, lambda: nn.ConvTranspose2d(4, 8, 3), x2),
    mod_case("conv_transpose2d_stride2", F, lambda: nn.ConvTranspose2d(4, 8, 2, stride=2), x2),
    mod_case(
        "conv_transpose3d",
        F,
        lambda: nn.ConvTranspose3d(4, 4, 2, stride=2),
        x3,
        rules=(*CONV_TRANSPOSE3D_HOST, *CONV3D_QNN),
    ),
)

"""Pooling: max and average in 1-3-D, padding and stride variants, adaptive pooling."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from qnn_testing.cases.base import OpCase, mod_case, nothing_to_quantize, randn
from qnn_testing.cases.conv import CONV3D_QNN
from qnn_testing.expect import Rule, XFail

F = "pooling"


class _ConvThen(nn.Module):
    """A 1x1 conv (so quantizers annotate something), then the pooling op."""

    def __init__(self, dims: int, pool: nn.Module) -> None:
        super().__init__()
        conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
        self.conv = conv(4, 4, 1)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.pool(self.conv(x))
        return out


def _pool(name: str, dims: int, pool: nn.Module, **kw: Any) -> OpCase:
    shape = {1: (1, 4, 32), 2: (1, 4, 16, 16), 3: (1, 4, 8, 8, 8)}[dims]
    return mod_case(name, F, lambda: _ConvThen(dims, pool), randn(shape), **kw)


class _Fn(nn.Module):
    def __init__(self, f: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.f = f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(x)


# QNN 2.51's x86 emulator (through the bridge) gets quantized avg_pool2d wrong once the kernel is
# 4 or more: 16 dB vs fake quant at k=4, 5 dB at k=8, and QNN logs `q::AvgPool_valid does not
# have a valid splitting rule`. fp16 is right. Emulator or version skew: unknown without a device.
AVG_POOL_K4 = Rule(
    targets="qnn-*",
    precisions="*a*w*",
    outcome=XFail(
        "QNN emulator: quantized avg_pool2d with kernel >= 4 is wrong "
        "(`q::AvgPool_valid does not have a valid splitting rule`); fp16 is right"
    ),
)


# The 3-D cases' conv3d is not among what XNNPACK's quantizer annotates, and neither is the
# pooling: at 8a8w there is nothing to quantize, which is refused (not a float program labelled
# 8a8w). The pooling itself (no kernel in the 1.5.1 runtime) is rewritten into 2-D pooling by
# qnn_compile.decompositions, and the conv3d (5-D tensors the portable convolution refuses) into
# 2-D convolutions: both run at fp32 on the host.
NOTHING_3D = (*nothing_to_quantize("conv3d and 3-D pooling"), *CONV3D_QNN)
CASES: tuple[OpCase, ...] = (
    _pool("max_pool1d", 1, nn.MaxPool1d(2)),
    _pool("max_pool2d", 2, nn.MaxPool2d(2, 2), smoke=True),
    _pool("max_pool2d_k3_s1_pad", 2, nn.MaxPool2d(3, 1, padding=1)),
    _pool("max_pool3d", 3, nn.MaxPool3d(2, 2), rules=NOTHING_3D),
    _pool("max_pool3d_pad_s2", 3, nn.MaxPool3d(3, 2, padding=1), rules=NOTHING_3D),
    _pool("avg_pool1d", 1, nn.AvgPool1d(2)),
    _pool("avg_pool2d_k2", 2, nn.AvgPool2d(2, 2), smoke=True),
    _pool("avg_pool2d_k4", 2, nn.AvgPool2d(4, 4), rules=(AVG_POOL_K4,), qnn=True),
    _pool("avg_pool2d_pad", 2, nn.AvgPool2d(3, 2, padding=1)),
    _pool("avg_pool3d", 3, nn.AvgPool3d(2, 2), rules=NOTHING_3D),
    _pool(
        "avg_pool3d_pad_ceil",
        3,
        nn.AvgPool3d(3, 2, padding=1, ceil_mode=True, count_include_pad=False),
        rules=NOTHING_3D,
    ),
    _pool("adaptive_avg_pool1d", 1, nn.AdaptiveAvgPool1d(4)),
    # 16 -> 4: an average pooling with kernel 4 on QNN, hence its emulator error (19.9 dB at 8a8w).
    _pool("adaptive_avg_pool2d", 2, nn.AdaptiveAvgPool2d((4, 4)), rules=(AVG_POOL_K4,)),
    _pool("adaptive_avg_pool2d_global", 2, nn.AdaptiveAvgPool2d(1)),
    # Not in the Core ATen opset: rewritten (max pooling when divisible, window maxima if not).
    _pool("adaptive_max_pool2d", 2, nn.AdaptiveMaxPool2d((4, 4))),
    _pool("adaptive_max_pool2d_uneven", 2, nn.AdaptiveMaxPool2d((5, 3))),
    _pool("adaptive_avg_pool3d", 3, nn.AdaptiveAvgPool3d(2), rules=NOTHING_3D),
    _pool("adaptive_avg_pool3d_uneven", 3, nn.AdaptiveAvgPool3d((3, 5, 2)), rules=NOTHING_3D),
)

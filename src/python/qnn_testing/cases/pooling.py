"""Pooling: max and average in 1-3-D, padding and stride variants, adaptive pooling."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from qnn_common.errors import BackendNotAvailableError, StageError
from qnn_testing.cases.base import OpCase, mod_case, on_host, randn
from qnn_testing.expect import Raises, Rule, XFail

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


# The executorch 1.5.1 host runtime has no 3-D pooling kernels (max, avg, adaptive avg), and
# XNNPACK does not take those ops: the program lowers, then cannot load.
def _no_kernel(op: str) -> tuple[Rule, ...]:
    return on_host(
        Raises(BackendNotAvailableError, f"the host runtime has no {op} kernel", match=op)
    )


# Not in the Core ATen opset, so edge conversion refuses it before any backend sees it.
ADAPTIVE_MAX = on_host(
    Raises(StageError, "adaptive_max_pool2d is not in the Core ATen opset", match="Core ATen opset")
)

CASES: tuple[OpCase, ...] = (
    _pool("max_pool1d", 1, nn.MaxPool1d(2)),
    _pool("max_pool2d", 2, nn.MaxPool2d(2, 2), smoke=True),
    _pool("max_pool2d_k3_s1_pad", 2, nn.MaxPool2d(3, 1, padding=1)),
    _pool("max_pool3d", 3, nn.MaxPool3d(2, 2), rules=_no_kernel("max_pool3d_with_indices")),
    _pool("avg_pool1d", 1, nn.AvgPool1d(2)),
    _pool("avg_pool2d_k2", 2, nn.AvgPool2d(2, 2), smoke=True),
    _pool("avg_pool2d_k4", 2, nn.AvgPool2d(4, 4), rules=(AVG_POOL_K4,), qnn=True),
    _pool("avg_pool2d_pad", 2, nn.AvgPool2d(3, 2, padding=1)),
    _pool("avg_pool3d", 3, nn.AvgPool3d(2, 2), rules=_no_kernel("avg_pool3d")),
    _pool("adaptive_avg_pool1d", 1, nn.AdaptiveAvgPool1d(4)),
    _pool("adaptive_avg_pool2d", 2, nn.AdaptiveAvgPool2d((4, 4))),
    _pool("adaptive_avg_pool2d_global", 2, nn.AdaptiveAvgPool2d(1)),
    _pool("adaptive_max_pool2d", 2, nn.AdaptiveMaxPool2d((4, 4)), rules=ADAPTIVE_MAX),
    _pool(
        "adaptive_avg_pool3d", 3, nn.AdaptiveAvgPool3d(2), rules=_no_kernel("_adaptive_avg_pool3d")
    ),
)

"""Shape and layout: reshape / view / permute / transpose, squeeze, expand / repeat, cat / stack /
split / chunk / unbind, pad, flip / roll, pixel shuffle, interpolation."""

from __future__ import annotations

import signal

import torch
import torch.nn.functional as fn

from qnn_testing.cases.base import OpCase, lin_case, qnn_lowering_fails, randn
from qnn_testing.expect import Crashes, Rule

F = "shape"
X = (2, 8, 16)
x = randn(X)
img = randn((1, 4, 8, 16))

# ExecuTorch's QNN lowering fails inside one of its passes on replicate padding (measured at fp16).
PAD_REPLICATE_QNN = qnn_lowering_fails(
    "fp16",
    "ExecuTorch's QNN lowering fails on replicate padding (a pass reads a missing node)",
    "'NoneType' object has no attribute 'op'",
)
# An empty (0, 16) input: QNN's HTP library divides by zero (SIGFPE, "trap divide error" in
# libQnnHtp) and the process dies; measured on V75 at fp16, 8a8w and 16a8w. Isolated in a child.
EMPTY_QNN = Rule(
    "qnn-v75",
    outcome=Crashes(signal.SIGFPE, "QNN's HTP library divides by zero on an empty (0, 16) tensor"),
)

CASES: tuple[OpCase, ...] = (
    lin_case("reshape", F, lambda a: a.reshape(2, 4, 32), x),
    lin_case("flatten", F, lambda a: torch.flatten(a, 1), x),
    lin_case("permute", F, lambda a: a.permute(2, 0, 1), x, smoke=True),
    lin_case("permute_5d", F, lambda a: a.permute(0, 3, 1, 4, 2), randn((1, 2, 3, 2, 16))),
    lin_case("transpose_neg", F, lambda a: a.transpose(-1, -2), x),
    lin_case("squeeze", F, lambda a: a.squeeze(1), randn((2, 1, 16))),
    lin_case("expand", F, lambda a: a.expand(2, 3, 8, 16), randn((1, 8, 16))),
    lin_case("repeat", F, lambda a: a.repeat(1, 2, 1), x),
    lin_case("cat", F, lambda a, b: torch.cat([a, b], dim=1), randn(X, (2, 4, 16)), smoke=True),
    lin_case("cat_neg_dim", F, lambda a, b: torch.cat([a, b, a], dim=-1), randn(X, (2, 8, 5))),
    lin_case("stack", F, lambda a, b: torch.stack([a, b], dim=0), randn(X, X)),
    lin_case("split", F, lambda a: torch.split(a, [4, 12], dim=-1), x, note="two outputs"),
    lin_case("chunk", F, lambda a: torch.chunk(a, 4, dim=1), x, note="four outputs"),
    lin_case("unbind", F, lambda a: torch.unbind(a, dim=0), x, note="two outputs"),
    lin_case("pad_constant", F, lambda a: fn.pad(a, (1, 2, 0, 1), value=0.5), x),
    lin_case("pad_reflect", F, lambda a: fn.pad(a, (2, 2), mode="reflect"), x),
    lin_case(
        "pad_replicate",
        F,
        lambda a: fn.pad(a, (1, 3, 2, 0), mode="replicate"),
        img,
        rules=(PAD_REPLICATE_QNN,),
    ),
    lin_case("flip", F, lambda a: torch.flip(a, dims=[-1]), x),
    lin_case("roll", F, lambda a: torch.roll(a, 3, dims=1), x),
    lin_case("pixel_shuffle", F, lambda a: fn.pixel_shuffle(a, 2), img),
    lin_case(
        "upsample_nearest2d",
        F,
        lambda a: fn.interpolate(a, scale_factor=2),
        img,
    ),
    lin_case(
        "upsample_bilinear2d", F, lambda a: fn.interpolate(a, size=[12, 20], mode="bilinear"), img
    ),
    lin_case(
        "upsample_bilinear_align",
        F,
        lambda a: fn.interpolate(a, scale_factor=2, mode="bilinear", align_corners=True),
        img,
    ),
    lin_case(
        "empty_batch",
        F,
        lambda a: a * 2.0,
        randn((0, 16)),
        rules=(EMPTY_QNN,),
        note="empty input (0, 16)",
    ),
)

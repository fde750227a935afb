"""Linear algebra: linear, matmul, bmm, einsum, addmm, baddbmm."""

from __future__ import annotations

import torch
from torch import nn

from qnn_testing.cases.base import OpCase, lin_case, mod_case, randn
from qnn_testing.expect import Rule, XFail

F = "linalg"


class _Bilinear(nn.Module):
    """Two linears whose outputs multiply as matrices: matmul of two activations."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.q = nn.Linear(16, 16)
        self.k = nn.Linear(16, 16)
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.q(x), self.k(x)
        if self.op == "bmm":
            return torch.bmm(q, k.transpose(1, 2))
        if self.op == "einsum":
            return torch.einsum("bid,bjd->bij", q, k)
        if self.op == "baddbmm":
            return torch.baddbmm(q[:, :, :8], q, k.transpose(1, 2)[:, :, :8], beta=0.5)
        return torch.matmul(q, k.transpose(-1, -2))


# An LPBQ linear compiled for V79 (SM8750) or V81 (SM8850) on the emulator is right (84.9 dB vs
# fake quant) in some runs and wrong in others (10.52 dB, cosine 0.956; the same wrong numbers
# each time), for the same program: seen in two CI runs, one arch failing in each. V73 / V75 are
# always right. Emulator, QNN 2.51's LPBQ path for the newer archs, or state in the process:
# unknown without a device. Not strict, so neither outcome fails the suite; both are reported.
_LPBQ_NEW = XFail(
    "LPBQ linear for V79 / V81 on the emulator is nondeterministic: 84.9 dB in some runs, "
    "10.5 dB vs fake quant in others (V73 / V75: always 85 dB)",
    strict=False,
)
# A later CI run saw the same 10.52 dB on V73: not arch-specific, so every arch is covered.
LPBQ_V79_V81 = (Rule("qnn-*", "16a4w_block", outcome=_LPBQ_NEW),)

seq = randn((2, 8, 16))

CASES: tuple[OpCase, ...] = (
    mod_case(
        "linear",
        F,
        lambda: nn.Linear(16, 8),
        randn((4, 16)),
        linear=True,
        smoke=True,
        qnn=True,
        rules=LPBQ_V79_V81,
    ),
    mod_case(
        "linear_no_bias", F, lambda: nn.Linear(16, 8, bias=False), randn((4, 16)), linear=True
    ),
    mod_case("linear_3d", F, lambda: nn.Linear(16, 32), seq, linear=True),
    mod_case("linear_1d_input", F, lambda: nn.Linear(16, 8), randn((16,)), linear=True),
    mod_case("matmul", F, lambda: _Bilinear("matmul"), seq, linear=True, qnn=True),
    mod_case("bmm", F, lambda: _Bilinear("bmm"), seq, linear=True),
    mod_case("einsum", F, lambda: _Bilinear("einsum"), seq, linear=True),
    mod_case("baddbmm", F, lambda: _Bilinear("baddbmm"), seq, linear=True),
    lin_case("mm", F, lambda a, w: torch.mm(a, w), randn((4, 16), (16, 8))),
    lin_case(
        "addmm", F, lambda a, w, b: torch.addmm(b, a, w, alpha=0.5), randn((4, 16), (16, 8), (8,))
    ),
)

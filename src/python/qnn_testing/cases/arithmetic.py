"""Arithmetic, elementwise math and comparisons: tensor and scalar operands, `alpha`,
broadcasting, integer and bool dtypes."""

from __future__ import annotations

import torch

from qnn_testing.cases.base import OpCase, bools, concat, fn_case, ints, lin_case, positive, randn
from qnn_testing.expect import Rule, XFail

F = "arithmetic"
X = (4, 16)
_pair = randn(X, X)
_row = randn(X, (16,))
_col = randn(X, (4, 1))


# The portable int32 remainder (which XNNPACK leaves to it) computes C's truncated remainder,
# not PyTorch's floored one: remainder(-8, 9) gives -8 where PyTorch gives 1 (measured).
_REMAINDER = XFail(
    "portable int32 remainder keeps the dividend's sign (C `%`), PyTorch the "
    "divisor's: remainder(-8, 9) = -8, expected 1"
)
REMAINDER_INT = (Rule("xnnpack", outcome=_REMAINDER), Rule("portable", outcome=_REMAINDER))

CASES: tuple[OpCase, ...] = (
    lin_case("add", F, torch.add, _pair, smoke=True, qnn=True),
    lin_case("add_alpha", F, lambda a, b: torch.add(a, b, alpha=0.5), _pair),
    lin_case("add_scalar", F, lambda a: a + 1.5, randn(X)),
    lin_case("add_broadcast_row", F, torch.add, _row),
    lin_case("add_broadcast_4d", F, torch.add, randn((2, 3, 4, 16), (1, 3, 1, 16))),
    lin_case("add_5d", F, torch.add, randn((1, 2, 2, 3, 16), (1, 2, 2, 3, 16))),
    lin_case("add_size1", F, torch.add, randn((1, 1, 16), (1, 1, 16))),
    lin_case("sub", F, torch.sub, _pair),
    lin_case("sub_alpha", F, lambda a, b: torch.sub(a, b, alpha=2), _pair),
    lin_case("mul", F, torch.mul, _pair, smoke=True),
    lin_case("mul_scalar", F, lambda a: a * 0.25, randn(X)),
    lin_case("div", F, torch.div, concat(randn(X), positive(X))),
    lin_case(
        "div_floor",
        F,
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        concat(randn(X, scale=4.0), positive(X)),
    ),
    lin_case("pow_scalar", F, lambda a: a**2, randn(X)),
    lin_case("maximum", F, torch.maximum, _pair),
    lin_case("neg", F, torch.neg, randn(X)),
    lin_case("abs", F, torch.abs, randn(X)),
    lin_case("sqrt", F, lambda a: torch.sqrt(a.abs() + 0.1), randn(X)),
    lin_case("exp", F, torch.exp, randn(X, scale=0.5)),
    lin_case("log", F, lambda a: torch.log(a.abs() + 0.5), randn(X)),
    lin_case("reciprocal", F, lambda a: torch.reciprocal(a.abs() + 0.5), randn(X)),
    lin_case("clamp", F, lambda a: torch.clamp(a, -0.5, 0.5), randn(X)),
    lin_case("clamp_min_only", F, lambda a: torch.clamp(a, min=-0.25, max=None), randn(X)),
    lin_case("round", F, lambda a: torch.round(a * 4), randn(X)),
    lin_case("sin", F, torch.sin, randn(X)),
    lin_case("erf", F, torch.erf, randn(X)),
    lin_case("lerp", F, lambda a, b: torch.lerp(a, b, 0.3), _pair),
    # Comparisons: bool outputs, compared exactly. Operands come from the linear, so quantized
    # modes compare dequantized values; a flipped bool right at the threshold is a real deviation.
    lin_case("gt", F, lambda a, b: (a > b).float(), _pair),
    lin_case("eq_round", F, lambda a, b: torch.eq(torch.round(a), torch.round(b)).float(), _pair),
    lin_case("where", F, lambda a, b: torch.where(a > 0, a, b), _pair),
    # Integer and bool dtypes: no quantizer touches them; results must be exact everywhere.
    fn_case("add_int", F, torch.add, ints(X, X), integer=True),
    fn_case("sub_int_alpha", F, lambda a, b: torch.sub(a, b, alpha=3), ints(X, X), integer=True),
    fn_case(
        "floor_divide_int",
        F,
        lambda a, b: torch.floor_divide(a, b.abs() + 1),
        ints(X, X),
        integer=True,
    ),
    fn_case(
        "remainder_int",
        F,
        lambda a, b: torch.remainder(a, b.abs() + 1),
        ints(X, X),
        integer=True,
        rules=REMAINDER_INT,
    ),
    fn_case("eq_int", F, torch.eq, ints(X, X, low=0, high=3), integer=True),
    fn_case("bitwise_and", F, torch.bitwise_and, ints(X, X, low=0, high=16), integer=True),
    fn_case("logical_and", F, torch.logical_and, bools(X, X), integer=True),
    fn_case("logical_not", F, torch.logical_not, bools(X), integer=True),
)

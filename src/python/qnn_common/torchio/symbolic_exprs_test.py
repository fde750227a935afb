from __future__ import annotations

from typing import Any

import pytest
import sympy  # pants: no-infer-dep (torch requires it; not a requirement of ours)
import torch
from torch.utils._sympy import functions

from qnn_common.torchio.symbolic_exprs import (
    MAX_EXPR_CHARS,
    UnsafeExpressionError,
    check_sym_expr,
)

_S = sympy.Symbol("s77", positive=True, integer=True)
_U = sympy.Symbol("u0", integer=True)

# What torch.export.save writes (`sympy.srepr`) for the expressions export makes.
WRITTEN = [
    _S, _S - 1, 2 * _S + 1, _S**2, -_S, sympy.Rational(1, 2) * _S, sympy.Float(1.5) * _S,
    sympy.Max(_S, 2), sympy.Min(_S, _U), functions.FloorDiv(_S, 2), functions.Mod(_S, 3),
    functions.PowByNatural(_S, 2), functions.ModularIndexing(_S, 1, 4),
    sympy.Eq(_S, 4), _S < 4, _S >= 2, sympy.Ne(_S, 3), sympy.And(_S < 4, _S > 1),
    sympy.Not(sympy.Eq(_S, 1)), sympy.true, sympy.false, sympy.oo, -sympy.oo, sympy.Integer(-5),
]


@pytest.mark.parametrize("expr", WRITTEN, ids=str)
def test_what_export_writes_is_accepted_and_sympify_reads_it_back(expr: sympy.Basic) -> None:
    text = sympy.srepr(expr)
    check_sym_expr(text)
    locals_ = {name: getattr(functions, name)
               for name in ("FloorDiv", "Mod", "PowByNatural", "ModularIndexing")}
    assert sympy.sympify(text, locals=locals_) == expr


def test_a_real_dynamic_program_sizes_fit() -> None:
    class Halve(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x[1:] * 2, torch.zeros(x.shape[0] // 2)

    dim = torch.export.Dim("b", min=4, max=64)
    program = torch.export.export(Halve(), (torch.randn(8, 3),), dynamic_shapes=({0: dim},))
    sizes: list[Any] = [
        size for node in program.graph.nodes
        if isinstance(value := node.meta.get("val"), torch.Tensor)
        for size in value.shape if isinstance(size, torch.SymInt)
    ]
    assert sizes
    for size in sizes:
        check_sym_expr(sympy.srepr(size.node.expr))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("__import__('os').system('true')", "call of something other than a name"),
        ("__import__('os')", "calls '__import__'"),
        ("(__import__('os').system('true') and 16)", "Python syntax"),
        ("Integer(16).__class__", "Python syntax"),
        ("Symbol('s0', integer=__import__('os'))", "keyword 'integer'"),
        ("Symbol('x; import os')", "not an identifier"),
        ("Symbol('s0', evaluate=True)", "keyword 'evaluate'"),
        ("Add(Integer(1), Integer(2), evaluate=False)", "passes keywords"),
        ("Float('1e5; x')", "not a decimal"),
        ("lambda: 1", "Python syntax"),
        ("[Integer(1)]", "Python syntax"),
        ("eval", "the name 'eval'"),
        ("sympify('1')", "not a sympy size function"),
        ("Integer(1) + Integer(2)", "Python syntax"),
        ("Integer(99999999999999999999)", "outside int64"),
        ("Pow(Integer(10), Integer(1000000000))", "power 1000000000"),
        ("Pow(Pow(Pow(Integer(2), Integer(64)), Integer(64)), Integer(64))", "nests powers"),
        ("Integer('5')", "str literal"),
        ("Add(" * 300 + "Integer(1)" + ")" * 300, "does not parse"),
        ("Add(Integer(1), " + "Integer(1), " * 2000 + "Integer(1))", "characters long"),
    ],
)
def test_anything_else_is_refused_with_why(text: str, why: str) -> None:
    with pytest.raises(UnsafeExpressionError, match=why.replace("(", r"\(")):
        check_sym_expr(text)


def test_not_text_is_refused() -> None:
    with pytest.raises(UnsafeExpressionError, match="is a int"):
        check_sym_expr(16)
    assert MAX_EXPR_CHARS >= 1000  # a 30-layer graph's longest size expression fits

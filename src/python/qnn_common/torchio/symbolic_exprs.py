"""The grammar a symbolic size from a `.pt2` must fit before torch parses it.

torch.export.save writes every symbolic size, stride and SymBool as `sympy.srepr` text
(`Add(Symbol('s0', positive=True, integer=True), Integer(-1))`), and torch's deserializer reads it
back with `sympy.sympify`, which evaluates the text as Python: `__import__('os').system(...)` in
a size runs on load. `check_sym_expr` accepts only what srepr writes for the expressions export
produces: calls of the sympy classes and torch's sympy functions named below, whose arguments are
such calls, integer literals, and, for `Symbol` and `Float`, one short string and boolean /
integer keywords. Nothing else (attributes, subscripts, lambdas, operators other than a leading
minus, other names) is accepted, so what sympify evaluates is a tree of constructor calls.

Constructors evaluate eagerly: `Pow(Integer(10), Integer(10**18))` would compute its digits. So
integers are bounded to int64, a literal exponent to `_MAX_EXPONENT`, powers nest at most
`_MAX_POW_DEPTH` deep, and the text is at most `MAX_EXPR_CHARS` long: evaluating an accepted
expression costs at most a few kilobits per number.
"""

from __future__ import annotations

import ast
import re
from typing import TypeGuard

MAX_EXPR_CHARS = 10_000
_INT64 = 2**63
_MAX_EXPONENT = 64
_MAX_POW_DEPTH = 2
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
_FLOAT_TEXT = re.compile(r"-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?\Z")

# What srepr writes for the sympy objects export produces (sizes, relations, their booleans).
_SYMPY_CALLS = frozenset({
    "Integer", "Rational", "Add", "Mul", "Pow", "Max", "Min", "Abs", "floor", "ceiling", "Mod",
    "Equality", "Unequality", "StrictLessThan", "LessThan", "StrictGreaterThan", "GreaterThan",
    "And", "Or", "Not",
})
# torch's sympy functions: the locals its deserializer hands sympify (torch.utils._sympy.functions).
_TORCH_CALLS = frozenset({
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt",
    "RoundDecimal", "ToFloat", "Identity",
})
_POWERS = frozenset({"Pow", "PowByNatural", "FloatPow", "LShift"})
_CONSTANTS = frozenset({"true", "false", "oo", "zoo", "nan"})
_SYMBOL_ASSUMPTIONS = frozenset({
    "positive", "negative", "nonnegative", "nonpositive", "integer", "real", "finite", "zero",
    "nonzero", "even", "odd",
})


class UnsafeExpressionError(ValueError):
    """The text is not a symbolic expression torch.export.save writes; the message says why."""


def check_sym_expr(text: object) -> None:
    """Raise UnsafeExpressionError unless `text` fits the grammar above."""
    if not isinstance(text, str):
        raise UnsafeExpressionError(f"is a {type(text).__name__}, not expression text")
    if len(text) > MAX_EXPR_CHARS:
        raise UnsafeExpressionError(
            f"is {len(text):,} characters long (at most {MAX_EXPR_CHARS:,})"
        )
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise UnsafeExpressionError(f"does not parse ({type(err).__name__})") from None
    _check(tree.body, pow_depth=0)


def _check(node: ast.expr, pow_depth: int) -> None:
    if isinstance(node, ast.Constant) and _is_int(node.value):
        _bounded(node.value)
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        if isinstance(node.operand, ast.Name) and node.operand.id == "oo":
            return
        if isinstance(node.operand, ast.Constant) and _is_int(node.operand.value):
            _bounded(node.operand.value)
            return
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        name = node.func.id
        if name == "Symbol":
            _check_symbol(node)
            return
        if name == "Float":
            _check_float(node)
            return
        if name in _SYMPY_CALLS or name in _TORCH_CALLS:
            if node.keywords:
                raise UnsafeExpressionError(f"passes keywords to {name}")
            depth = pow_depth + (name in _POWERS)
            if depth > _MAX_POW_DEPTH:
                raise UnsafeExpressionError(f"nests powers more than {_MAX_POW_DEPTH} deep")
            if name in _POWERS and len(node.args) == 2:
                _check_exponent(node.args[1])
            for arg in node.args:
                _check(arg, depth)
            return
        raise UnsafeExpressionError(f"calls {name[:64]!r}, which is not a sympy size function")
    raise UnsafeExpressionError(f"holds {_describe(node)}, which is not part of a symbolic size")


def _check_symbol(node: ast.Call) -> None:
    if len(node.args) != 1 or not isinstance(node.args[0], ast.Constant):
        raise UnsafeExpressionError("has a Symbol without exactly one name")
    name = node.args[0].value
    if not isinstance(name, str) or not _NAME.match(name):
        raise UnsafeExpressionError(f"has a Symbol named {str(name)[:64]!r}, not an identifier")
    for keyword in node.keywords:
        if keyword.arg not in _SYMBOL_ASSUMPTIONS or not (
            isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, bool)
        ):
            raise UnsafeExpressionError(f"has a Symbol with the keyword {keyword.arg!r}")


def _check_float(node: ast.Call) -> None:
    if len(node.args) != 1 or not isinstance(node.args[0], ast.Constant):
        raise UnsafeExpressionError("has a Float without exactly one value")
    text = node.args[0].value
    if not isinstance(text, str) or len(text) > 64 or not _FLOAT_TEXT.match(text):
        raise UnsafeExpressionError(f"has a Float of {str(text)[:64]!r}, not a decimal number")
    for keyword in node.keywords:
        value = keyword.value
        if keyword.arg != "precision" or not (
            isinstance(value, ast.Constant) and _is_int(value.value) and 0 < value.value <= 256
        ):
            raise UnsafeExpressionError(f"has a Float with the keyword {keyword.arg!r}")


def _check_exponent(node: ast.expr) -> None:
    literal = _literal_int(node)
    if literal is not None and abs(literal) > _MAX_EXPONENT:
        raise UnsafeExpressionError(f"raises to the power {literal} (at most {_MAX_EXPONENT})")


def _literal_int(node: ast.expr) -> int | None:
    """The integer an `Integer(n)` or bare literal stands for, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1:
        if node.func.id == "Integer":
            return _literal_int(node.args[0])
        return None
    if isinstance(node, ast.Constant) and _is_int(node.value):
        return node.value
    if (
        isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant) and _is_int(node.operand.value)
    ):
        return -node.operand.value
    return None


def _bounded(value: int) -> None:
    if not -_INT64 <= value < _INT64:
        raise UnsafeExpressionError("holds an integer outside int64")


def _describe(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        return "a call of something other than a name"
    if isinstance(node, ast.Name):
        return f"the name {node.id[:64]!r}"
    if isinstance(node, ast.Constant):
        return f"a {type(node.value).__name__} literal"
    return f"Python syntax ({type(node).__name__})"


def _is_int(value: object) -> TypeGuard[int]:
    """An int literal; bools are ints to Python but not sizes."""
    return isinstance(value, int) and not isinstance(value, bool)

"""A `.pt2`'s program JSON (`models/model.json`), checked so that torch's loader runs none of it.

The JSON holds no pickles, but torch turns four kinds of its strings into code or imports:

- symbolic sizes, strides and SymBools (`{"as_expr": {"expr_str": ...}}`): parsed with
  `sympy.sympify`, which evaluates Python. Each must fit `symbolic_exprs.check_sym_expr`.
- `guards_code`: Python source that `ExportedProgram.module()` pastes into a function and `exec`s,
  then calls on every forward. Guards are never built from a file: the checked copy has none.
  They only restate input checks: the program's range constraints (plain integers, kept) still
  bound every symbolic input size.
- node targets and operator arguments (`"target"`, `"as_operator"`): resolved by `getattr` from
  `torch`, `operator` or `math` (any attribute: `torch.load`, `torch.utils.cpp_extension`...).
  torch's verifier refuses a graph that calls anything but an operator or one of a few functions,
  but only after resolving; here each name must be an operator in `torch.ops`
  (`torch.ops.<namespace>.<op>[.<overload>]`, no dunder part) or one of the functions that
  verifier allows (`_CALLABLES`), before torch resolves anything.
- tree specs (`in_spec`, `out_spec`): a `collections.defaultdict` node imports the module its
  context names, and an `"__enum__"` object in any context imports a module and looks an
  attribute up. Both are refused; other node types are resolved by torch from its registry.

Everything else in the JSON is data (names, integers, dtypes, metadata strings). The JSON is
parsed once here (nesting and number sizes bounded by Python's parser: both raise), and torch is
given this module's re-serialization of what was checked.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch._export.verifier import Verifier

from qnn_common.errors import ArtifactError
from qnn_common.torchio.symbolic_exprs import UnsafeExpressionError, check_sym_expr

_REEXPORT = (
    "Re-export the program with torch.export.save if you made it; a program from elsewhere that "
    "holds this cannot be loaded safely"
)
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# A name torch resolves inside torch.ops; no dunder part, so no attribute of the namespace object.
_OP_TARGET = re.compile(rf"torch\.ops(\.(?!__){_IDENT}){{2,3}}\Z")
# Except aten's bitwise operators, whose names are dunders (`torch.ops.aten.__and__.Tensor`: a
# boolean mask of Gemma 2's sliding window); none is an attribute of torch.ops.aten itself, so
# each resolves to its operator. Named one by one rather than by pattern.
_DUNDER_OPS = ("and", "or", "xor", "lshift", "rshift", "iand", "ior", "ixor", "ilshift",
               "irshift")
_DUNDER_OP_TARGET = re.compile(
    rf"torch\.ops\.aten\.__(?:{'|'.join(_DUNDER_OPS)})__(\.(?!__){_IDENT})?\Z"
)


def _qualified(function: Callable[..., Any]) -> str:
    return f"{function.__module__}.{function.__name__}"


# The functions other than operators that torch's serializer writes by module and name and its
# verifier lets a graph call: its builtins (getitem, arithmetic on sizes), the symbolic-size
# functions and the grad-mode / autocast switches of pre-dispatch graphs.
_CALLABLE_OBJECTS: tuple[Callable[..., Any], ...] = (
    *Verifier().allowed_builtin_ops(), operator.pos, torch.sym_not, torch.sym_int,
    torch.sym_float, torch.sym_ite, torch.sym_max, torch.sym_min, torch.sym_sqrt, torch.sym_sum,
    torch._C._set_grad_enabled, torch.amp.autocast_mode._enter_autocast,
    torch.amp.autocast_mode._exit_autocast,
)
_CALLABLES = frozenset(_qualified(f) for f in _CALLABLE_OBJECTS)
_TREESPEC_REFUSED = frozenset({"collections.defaultdict"})
_READ_AS_CODE = frozenset({"expr_str", "as_operator", "in_spec", "out_spec", "guards_code"})


def checked_program_json(path: Path, member: str, raw: bytes) -> bytes:
    """`raw` (the archive's `member`) as torch may read it; ArtifactError naming the first string
    torch would run, import or evaluate that is not what torch.export.save writes."""
    try:
        program: Any = json.loads(raw)
    except (ValueError, RecursionError, MemoryError) as err:
        raise ArtifactError(
            path, f"{member} is not valid program JSON ({type(err).__name__}: {str(err)[:200]}). "
            f"{_REEXPORT}",
        ) from None
    if not isinstance(program, dict):
        raise ArtifactError(path, f"{member} is a JSON {type(program).__name__}, not a program")
    for where, key, value in _strings_torch_reads(program):
        reason = _refusal(key, value)
        if reason is not None:
            raise ArtifactError(
                path, f"{member}: {where} {reason}; torch would run it as code when loading "
                f"it. {_REEXPORT}",
            )
    if program.get("guards_code"):
        program["guards_code"] = []
    return json.dumps(program).encode()


def _strings_torch_reads(program: dict[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """(where, key, value) for every value torch parses, resolves or executes; `where` is the
    JSON path of the object holding it. Iterative: depth is bounded by the parser, not here."""
    stack: list[tuple[_Path, Any]] = [(None, program)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            if {"target", "inputs", "outputs"} <= value.keys():  # a graph node
                yield _render(path), "target", value["target"]
            for key, item in value.items():
                if key in _READ_AS_CODE:
                    yield _render(path), key, item
                if isinstance(item, dict | list):
                    stack.append(((path, str(key)), item))
        elif isinstance(value, list):
            stack.extend(((path, str(index)), item) for index, item in enumerate(value)
                         if isinstance(item, dict | list))


# A JSON path as a linked list from the leaf: rendered only for the one value refused.
_Path = tuple["_Path", str] | None


def _render(path: _Path) -> str:
    parts: list[str] = []
    while path is not None:
        path, key = path
        parts.append(key)
    return ".".join(reversed(parts)) or "the program"


def _refusal(key: str, value: Any) -> str | None:
    """Why torch must not be given `value` under `key`, or None when it fits."""
    if key == "expr_str":
        try:
            check_sym_expr(value)
        except UnsafeExpressionError as err:
            return f"has a symbolic size that {err}"
        return None
    if key in ("target", "as_operator"):
        if isinstance(value, str) and (_OP_TARGET.match(value) or _DUNDER_OP_TARGET.match(value)
                                       or value in _CALLABLES):
            return None
        return f"names {str(value)[:200]!r} as an operator, which is not one in torch.ops"
    if key in ("in_spec", "out_spec"):
        if value is None:
            return None
        return _treespec_refusal(value)
    # guards_code: dropped, so only its shape matters.
    if isinstance(value, list) and all(isinstance(guard, str) for guard in value):
        return None
    return "has guards that are not a list of strings"


def _treespec_refusal(text: object) -> str | None:
    if not isinstance(text, str):
        return f"has a tree spec that is a {type(text).__name__}, not JSON text"
    try:
        spec = json.loads(text)
    except (ValueError, RecursionError, MemoryError) as err:
        return f"has a tree spec that is not JSON ({type(err).__name__})"
    if not (isinstance(spec, list) and len(spec) == 2):
        return "has a tree spec that is not [protocol, spec]"
    nodes = [spec[1]]
    while nodes:
        node = nodes.pop()
        if not (isinstance(node, dict) and isinstance(node.get("children_spec"), list)):
            return "has a tree spec node that is not {type, context, children_spec}"
        kind, context = node.get("type"), node.get("context")
        if kind is not None and not isinstance(kind, str):
            return "has a tree spec node whose type is not a name"
        if kind in _TREESPEC_REFUSED:
            return f"has a tree spec node of type {kind!r}, which imports a module it names"
        if isinstance(context, str) and (reason := _context_refusal(context)) is not None:
            return reason
        nodes.extend(node["children_spec"])
    return None


def _context_refusal(context: str) -> str | None:
    """Why torch must not parse this tree spec context: its enum hook imports the module an
    `"__enum__"` object names."""
    try:
        values = [json.loads(context)]
    except (ValueError, RecursionError, MemoryError):
        return None  # a registered type's own context format, or one torch refuses itself
    while values:
        value = values.pop()
        if isinstance(value, dict):
            if "__enum__" in value:
                return "has a tree spec context holding an enum, which imports a module it names"
            values.extend(value.values())
        elif isinstance(value, list):
            values.extend(value)
    return None

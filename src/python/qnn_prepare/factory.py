"""The custom task's models: a user's ``package.module:function`` factory (`FACTORY_CONTRACT`).

The factory is imported from its current source on every load (`_import_current`), since the
prepare cache key follows that source (`qnn_prepare.provenance`).
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import inspect
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from qnn_common.errors import ConfigValidationError
from qnn_common.torchio.program_state import initial_buffers_kept
from qnn_common.torchio.samples import ModelInputs, check_structure
from qnn_prepare.task import LoadedModel

_FACTORY_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

FACTORY_CONTRACT = """\
A 'package.module:function' factory takes no arguments and returns (module, args) or
(module, args, kwargs):
  module  a torch.nn.Module;
  args    the positional arguments of its forward: a tuple (a list or a lone tensor is also
          taken as the arguments, so pass a single list or dict argument as (value,));
  kwargs  a dict of keyword arguments (str keys), optional.
Values nest tuples, lists and str-keyed dicts of tensors, int, float, bool and None: anything
torch.export accepts. Non-tensor values are baked into the program as constants, so every
calibration / eval / --inputs sample repeats the example's values; only tensors vary. Keyword
arguments that name a positional parameter of forward (in order, right after args) are passed by
position, so the program's signature is forward's; keyword-only ones stay keywords. The
program (and the .pte) take the pytree leaves of (args, kwargs) in order, constants included."""


def is_factory_spec(spec: str) -> bool:
    """Whether `spec` names a ``package.module:function`` factory (and not a path)."""
    spec = spec.strip()
    return "/" not in spec and not spec.startswith((".", "~")) and bool(_FACTORY_SPEC.match(spec))


# sha256 of each factory module's source as this process last executed it (see _import_current).
_EXECUTED_SOURCES: dict[str, str] = {}


def _import_current(module_name: str) -> ModuleType:
    """Import `module_name`, re-executing it from source if the file changed since this process
    last ran it: the prepare cache key follows the source (qnn_prepare.provenance), so a
    long-lived process (a notebook, a test, a service) must not keep exporting the old code.
    Compiled from the source text, not through importlib.reload, whose bytecode cache
    check (mtime in seconds and size) misses a same-size edit within the same second.
    """
    module = importlib.import_module(module_name)
    path = getattr(module, "__file__", None)
    if not path or not str(path).endswith(".py"):
        return module
    source = Path(path).read_bytes()
    digest = hashlib.sha256(source).hexdigest()
    if _EXECUTED_SOURCES.setdefault(module_name, digest) != digest:
        exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)
        _EXECUTED_SOURCES[module_name] = digest
    return module


def _import_path_hint() -> str:
    """Where a factory's module must be to import. A PEX (what `./pants run` runs) ignores
    PYTHONPATH and reads PEX_EXTRA_SYS_PATH instead; pex sets $PEX in the processes it runs."""
    if os.environ.get("PEX"):
        return (
            "this is a PEX (./pants run), which ignores PYTHONPATH: put the module's directory "
            "on PEX_EXTRA_SYS_PATH"
        )
    return (
        "put the module's directory on PYTHONPATH (on PEX_EXTRA_SYS_PATH under ./pants run, "
        "whose PEX ignores PYTHONPATH)"
    )


def _factory_inputs(
    spec: str, result: object
) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any], list[str]]:
    """Check a factory's return value against FACTORY_CONTRACT: (module, args, kwargs, input
    names).

    Keyword arguments that fill forward's positional parameters right after `args` move into
    `args` (named after their parameter): downstream, a sample is then called ``gm(*args)``
    like a flat one, and the program's signature is forward's own.
    """
    def refuse(problem: str) -> ConfigValidationError:
        return ConfigValidationError("model", spec, f"{problem}.\n{FACTORY_CONTRACT}")

    if not isinstance(result, tuple | list) or len(result) not in (2, 3):
        what = type(result).__name__
        if isinstance(result, tuple | list):
            what = f"{len(result)}-item {what}"
        raise refuse(f"the factory returned a {what}, not (module, args) or (module, args, kwargs)")
    module, args, kwargs = (*result, {}) if len(result) == 2 else result
    if not isinstance(module, nn.Module):
        raise refuse(f"the factory's first item is a {type(module).__name__}, not an nn.Module")
    if isinstance(args, torch.Tensor):
        args = (args,)
    if isinstance(args, dict):
        raise refuse(
            "the factory's args is a dict; return (module, (), that_dict) to pass it as keyword "
            "arguments, or (module, (that_dict,)) to pass it as one argument"
        )
    if not isinstance(args, tuple | list):
        raise refuse(f"the factory's args is a {type(args).__name__}, not a tuple")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise refuse(f"the factory's kwargs is a {type(kwargs).__name__}, not a dict")
    args, kwargs = tuple(args), dict(kwargs)
    problem = check_structure(args, "args") or check_structure(kwargs, "kwargs")
    if problem is not None:
        raise refuse(problem)
    if not any(isinstance(v, torch.Tensor) for v in ModelInputs(args, kwargs).leaves()):
        raise refuse(
            "the example inputs hold no tensor; torch.export would bake every input into the "
            "program as a constant, leaving nothing to feed it"
        )
    names = [f"input_{i}" for i in range(len(args))]
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # no introspectable signature: keep the keywords as given
        params = []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for param in params[len(args):]:
        if param.kind not in positional or param.name not in kwargs:
            break  # a gap (a default left out) or a keyword-only parameter: the rest stay keywords
        args += (kwargs.pop(param.name),)
        names.append(param.name)
    return module, args, kwargs, names


def load_factory(spec: str) -> LoadedModel:
    """Import and call the factory `spec` names; check what it returns against the contract."""
    module_name, func_name = spec.split(":")
    try:
        py_module = _import_current(module_name)
    except ImportError as err:
        raise ConfigValidationError(
            "model", spec, f"cannot import {module_name!r} ({err}); {_import_path_hint()}"
        ) from err
    # User code: a syntax error or whatever its top level raises, sys.exit() included (it would
    # otherwise end the whole run with its exit code and no message).
    except (Exception, SystemExit) as err:
        raise ConfigValidationError(
            "model",
            spec,
            f"importing {module_name!r} failed ({type(err).__name__}: {err}); fix the module",
        ) from err
    factory = getattr(py_module, func_name, None)
    if not callable(factory):
        raise ConfigValidationError(
            "model", spec, f"{module_name!r} has no callable named {func_name!r}"
        )
    try:
        result = factory()
    except SystemExit as err:
        raise ConfigValidationError(
            "model",
            spec,
            f"the factory called sys.exit({err.code!r}) instead of returning "
            "(module, args); raise an exception to report a failure",
        ) from None
    module, example, kwargs, names = _factory_inputs(spec, result)
    module = module.eval()
    # One eager call names the outputs and fails here, with the spec in the message, rather than
    # deep inside torch.export.
    try:
        # On a copy: a model that updates its inputs in place would otherwise change the
        # example inputs that are exported with and saved as the first eval sample; and its
        # buffers as registered: it is exported after this.
        with torch.no_grad(), initial_buffers_kept(module):
            out = module(*copy.deepcopy(example), **copy.deepcopy(kwargs))
    except (Exception, SystemExit) as err:  # user code: reported against the spec, exits too
        raise ConfigValidationError(
            "model", spec, f"the module fails on its own example inputs: {err}"
        ) from err
    leaves = torch.utils._pytree.tree_leaves(out)
    if not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
        raise ConfigValidationError("model", spec, "the module must return tensors only")
    return LoadedModel(
        name=func_name,
        kind="custom",
        module=module,
        example_inputs=example,
        input_names=tuple(names),
        output_names=tuple(f"output_{i}" for i in range(len(leaves))),
        tokenizer=None,
        tokenizer_files=(),
        vocab_size=None,
        example_kwargs=kwargs,
    )

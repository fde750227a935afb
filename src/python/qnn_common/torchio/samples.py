"""The sample files that travel between stages: model inputs and outputs, checked on the way in.

Every load goes through `tensor_file.load_tensor_file`: these files may come from users, so their
sizes and structure are bounded before torch reads them, and a pickle from outside is only ever
unpickled weights-only, never executing code. Once loaded, `check_structure` bounds each
sample's nesting again (by identity: shared parts counted once) before anything walks it.

Files are serialized in memory and then written atomically: torch names the zip's inner folder
after the file it writes, so writing a temp file directly would put its random name into the
bytes, and the same inputs would not give the same file. Exported programs (`.pt2`) are
`programs.py`'s.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from qnn_common.errors import ArtifactError
from qnn_common.store.atomic import atomic_write_bytes
from qnn_common.torchio.tensor_file import load_tensor_file

Sample = tuple[torch.Tensor, ...]

# Leaf values an input structure may hold besides tensors: what torch.export takes as a
# (specialized) constant input and what torch.load(weights_only=True) rebuilds.
_CONSTANT_TYPES = (bool, int, float, type(None))

# Marks a file of structured samples (see save_samples); a bare list is the flat format.
_STRUCTURED_KEY = "qnn_inputs"
_STRUCTURED_VERSION = 1
# Bounds on one value's structure (a sample's args or kwargs), as a tree: no honest input comes
# near them, and every later walk (tree_flatten, deepcopy, describe) stays cheap within them.
MAX_DEPTH = 32
MAX_VALUES = 2**20
_WHAT = "a file of samples"


@dataclass(frozen=True)
class ModelInputs:
    """One call of a model: ``module(*args, **kwargs)``.

    `args` and `kwargs` values nest tuples, lists and dicts (str keys) of tensors, ints, floats,
    bools and None: what torch.export accepts. torch.export bakes the non-tensor leaves into the
    program as constants, yet the program (and the .pte compiled from it) still takes every leaf
    as an input: `leaves` is that flat list, in the program's order.
    """

    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def leaves(self) -> tuple[Any, ...]:
        """The pytree leaves of ``(args, kwargs)`` in order, None and other constants included:
        the flat inputs an exported program's graph and its .pte method take."""
        return tuple(torch.utils._pytree.tree_leaves((tuple(self.args), dict(self.kwargs))))

    def is_flat(self) -> bool:
        """Whether this is the plain form: positional tensors only."""
        return not self.kwargs and all(isinstance(a, torch.Tensor) for a in self.args)

    def clone(self) -> ModelInputs:
        """A deep copy, for a call that may update its inputs in place."""
        return ModelInputs(copy.deepcopy(tuple(self.args)), copy.deepcopy(dict(self.kwargs)))

    def describe(self) -> str:
        """A compact signature, e.g. ``(float32[4, 5], [int64[2], int64[2]], 3, scale=2.0)``."""
        parts = [describe_value(a) for a in self.args]
        parts += [f"{k}={describe_value(v)}" for k, v in self.kwargs.items()]
        return f"({', '.join(parts)})"


def as_model_inputs(sample: Sample | ModelInputs) -> ModelInputs:
    """`sample` as ModelInputs (a flat tuple of tensors is the positional arguments)."""
    return sample if isinstance(sample, ModelInputs) else ModelInputs(tuple(sample))


def describe_value(value: object) -> str:
    """A compact description of one input value: tensors by dtype and shape, containers nested,
    constants by repr."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    if isinstance(value, tuple):
        inner = ", ".join(describe_value(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return f"[{', '.join(describe_value(v) for v in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {describe_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def check_structure(value: object, where: str) -> str | None:
    """None if `value` nests only tuples, lists, str-keyed dicts, tensors and constants (int,
    float, bool, None), at most `MAX_DEPTH` deep and `MAX_VALUES` values as a tree, else what is
    wrong and where (`where` names `value`).

    Linear in the number of distinct containers: one shared by several parents is checked once
    and counted by identity, so a small value whose parts repeat (``a = [a, a]`` forty times)
    is refused at once instead of walked 2^40 times, and a container holding itself is refused.
    """
    sizes: dict[int, tuple[int, int]] = {}  # id of a checked container -> (values, depth)
    open_: set[int] = set()
    pending: list[tuple[object, str, bool]] = [(value, where, False)]
    while pending:
        item, at, children_done = pending.pop()
        if not isinstance(item, tuple | list | dict):
            if not isinstance(item, (torch.Tensor, *_CONSTANT_TYPES)):
                return (
                    f"{at} is a {type(item).__name__}; inputs may nest tuples, lists and "
                    "str-keyed dicts of tensors, int, float, bool and None"
                )
            continue
        key = id(item)
        children = _children(item, at)
        if children_done:
            open_.discard(key)
            inner = [sizes.get(id(c), (1, 0)) for c, _ in children]
            sizes[key] = count, depth = (
                1 + sum(n for n, _ in inner), 1 + max((d for _, d in inner), default=0)
            )
            if depth > MAX_DEPTH:
                return f"{at} nests deeper than {MAX_DEPTH} levels"
            if count > MAX_VALUES:
                return (
                    f"{at} holds more than {MAX_VALUES} values once its shared parts are "
                    "expanded (containers that repeat themselves)"
                )
            continue
        if key in sizes:
            continue
        if key in open_:
            return f"{at} contains itself"
        if isinstance(item, dict):
            for k in item:
                if not isinstance(k, str):
                    kind = type(k).__name__
                    return f"{at} has a {kind} key {_short_repr(k)}; dict keys must be str"
        open_.add(key)
        pending.append((item, at, True))
        pending.extend((c, w, False) for c, w in reversed(children))
    return None


def _children(
    value: tuple[Any, ...] | list[Any] | dict[Any, Any], at: str
) -> list[tuple[object, str]]:
    if isinstance(value, dict):
        return [(v, f"{at}[{k!r}]") for k, v in value.items()]
    return [(v, f"{at}[{i}]") for i, v in enumerate(value)]


def _short_repr(value: object) -> str:
    text = repr(value) if isinstance(value, int | float | str | bytes | None) else ""
    return text if len(text) <= 40 else text[:37] + "..."


def save_samples(path: Path, samples: Sequence[Sample | ModelInputs]) -> None:
    """Save a non-empty list of samples atomically (weights_only-loadable).

    Flat samples (positional tensors only, e.g. outputs) are written as a list of tensor tuples,
    as before. If any sample has kwargs, containers or constants, the file is
    ``{"qnn_inputs": 1, "samples": [{"args": (...), "kwargs": {...}}, ...]}``: the structure
    itself, tuples, lists, dicts and constants included, which the weights-only unpickler
    rebuilds exactly (a list stays a list, so the program's input spec still matches).
    """
    if not samples:
        raise ArtifactError(path, "refusing to write an empty sample list")
    structured = [as_model_inputs(s) if isinstance(s, ModelInputs | tuple) else s for s in samples]
    for i, sample in enumerate(structured):
        if not isinstance(sample, ModelInputs):
            raise ArtifactError(path, f"sample {i} is a {type(sample).__name__}, not a tuple")
        problem = check_structure(tuple(sample.args), f"sample {i} args") or check_structure(
            dict(sample.kwargs), f"sample {i} kwargs"
        )
        if problem is not None:
            raise ArtifactError(path, problem)
    # Contiguous CPU clones: a view would drag its whole base storage into the file.
    data: object
    if all(s.is_flat() for s in structured):
        data = [tuple(_stored(a) for a in s.args) for s in structured]
    else:
        data = {
            _STRUCTURED_KEY: _STRUCTURED_VERSION,
            "samples": [
                {"args": _stored(tuple(s.args)), "kwargs": _stored(dict(s.kwargs))}
                for s in structured
            ],
        }
    buffer = io.BytesIO()
    torch.save(data, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def _stored(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().clone()
    if isinstance(value, tuple):
        return tuple(_stored(v) for v in value)
    if isinstance(value, list):
        return [_stored(v) for v in value]
    if isinstance(value, dict):
        return {k: _stored(v) for k, v in value.items()}
    return value


def _read(path: Path) -> object:
    return load_tensor_file(path, what=_WHAT)


def load_samples(path: Path, *, like: Sample | None = None) -> list[Sample]:
    """Load flat samples saved by `save_samples` (outputs, flat inputs), or a user file of the
    same shape.

    Accepted forms: one tensor (one single-input sample), a tuple of tensors (one sample), or a
    list of either. With `like`, every sample must match its count, dtypes and shapes. Anything
    else raises ArtifactError naming the file, the sample and what was expected; a file of
    structured inputs is read with `load_inputs`.
    """
    samples = _normalize(path, _read(path))
    if like is not None and (problem := sample_mismatch(samples, like)) is not None:
        raise ArtifactError(path, f"{problem}; regenerate the file with the model's input shapes")
    return samples


def load_inputs(path: Path, *, like: ModelInputs | None = None) -> list[ModelInputs]:
    """Load model inputs: any file `load_samples` reads, or structured samples.

    Forms: what `save_samples` writes; or a list whose items are a tensor (one argument), a
    tuple / list (the positional arguments, each any nesting of tuples, lists, str-keyed dicts,
    tensors, int, float, bool, None) or a dict ``{"args": (...), "kwargs": {...}}``; or one
    such item alone (one sample). With `like`, every sample must have its structure, tensor
    dtypes and shapes, and constants (torch.export baked them into the program).
    """
    data = _read(path)
    if isinstance(data, dict) and _STRUCTURED_KEY in data:
        version, items = data.get(_STRUCTURED_KEY), data.get("samples")
        if version != _STRUCTURED_VERSION or not isinstance(items, list):
            raise ArtifactError(
                path, f"is a {_STRUCTURED_KEY} file of unknown version {version!r}; "
                "regenerate it with this version's save_samples"
            )
    elif isinstance(data, list):
        items = data
    else:
        items = [data]  # one sample alone
    if not items:
        raise ArtifactError(path, "holds no samples")
    samples = [_to_inputs(path, i, item) for i, item in enumerate(items)]
    if like is not None and (problem := inputs_mismatch(samples, like)) is not None:
        raise ArtifactError(path, f"{problem}; regenerate the file with the model's inputs")
    return samples


def _to_inputs(path: Path, index: int, item: object) -> ModelInputs:
    if isinstance(item, torch.Tensor):
        sample = ModelInputs((item,))
    elif isinstance(item, tuple | list):
        sample = ModelInputs(tuple(item))
    elif isinstance(item, dict) and "args" in item and set(item) <= {"args", "kwargs"}:
        args, kwargs = item["args"], item.get("kwargs") or {}
        if not isinstance(args, tuple | list) or not isinstance(kwargs, dict):
            raise ArtifactError(
                path, f"sample {index}: 'args' must be a tuple and 'kwargs' a dict"
            )
        sample = ModelInputs(tuple(args), kwargs)
    else:
        raise ArtifactError(
            path,
            f"sample {index} is a {type(item).__name__}; expected a tensor, a tuple of "
            "arguments, or a dict {'args': (...), 'kwargs': {...}}",
        )
    problem = check_structure(tuple(sample.args), f"sample {index} args") or check_structure(
        dict(sample.kwargs), f"sample {index} kwargs"
    )
    if problem is not None:
        raise ArtifactError(path, problem)
    return sample


def inputs_mismatch(samples: Sequence[ModelInputs], like: ModelInputs) -> str | None:
    """None if every sample has `like`'s structure, tensor dtypes and shapes and constants,
    else what is wrong with the first sample that differs."""
    pytree = torch.utils._pytree
    want_leaves, want_spec = pytree.tree_flatten((tuple(like.args), dict(like.kwargs)))
    for i, sample in enumerate(samples):
        got_leaves, got_spec = pytree.tree_flatten((tuple(sample.args), dict(sample.kwargs)))
        if got_spec != want_spec:
            return (
                f"sample {i} is structured {sample.describe()}, the model takes "
                f"{like.describe()}"
            )
        for j, (got, want) in enumerate(zip(got_leaves, want_leaves, strict=True)):
            if isinstance(want, torch.Tensor):
                if not isinstance(got, torch.Tensor):
                    return f"sample {i} input {j}: expected a tensor, got {got!r}"
                if wrong := _tensor_mismatch(got, want):
                    return f"sample {i} input {j}: {wrong}"
            elif type(got) is not type(want) or got != want:
                return (
                    f"sample {i} input {j}: expected the constant {want!r}, got {got!r} "
                    "(torch.export bakes non-tensor inputs into the program, so every sample "
                    "must repeat the example's value)"
                )
    return None


def _normalize(path: Path, data: object) -> list[Sample]:
    if isinstance(data, torch.Tensor):
        return [(data,)]
    if isinstance(data, tuple) and data and all(isinstance(t, torch.Tensor) for t in data):
        return [data]
    if isinstance(data, dict) and _STRUCTURED_KEY in data:
        raise ArtifactError(
            path, "holds structured model inputs, not flat tensor tuples; read it with load_inputs"
        )
    if not isinstance(data, list):
        raise ArtifactError(
            path,
            f"expected a tensor, a tuple of tensors, or a list of those; got {type(data).__name__}",
        )
    if not data:
        raise ArtifactError(path, "holds no samples")
    out: list[Sample] = []
    for i, item in enumerate(data):
        tensors = (item,) if isinstance(item, torch.Tensor) else item
        if not isinstance(tensors, tuple | list) or not all(
            isinstance(t, torch.Tensor) for t in tensors
        ):
            raise ArtifactError(
                path, f"sample {i} is a {type(item).__name__}, not a tensor or tuple of tensors"
            )
        out.append(tuple(tensors))
    return out


def sample_mismatch(samples: Sequence[Sample], like: Sample) -> str | None:
    """None if every sample matches `like` in count, dtype and shape, else what is wrong."""
    for i, sample in enumerate(samples):
        if len(sample) != len(like):
            return f"sample {i} has {len(sample)} tensors, the model takes {len(like)}"
        for j, (got, want) in enumerate(zip(sample, like, strict=True)):
            if wrong := _tensor_mismatch(got, want):
                return f"sample {i} input {j}: {wrong}"
    return None


def _tensor_mismatch(got: torch.Tensor, want: torch.Tensor) -> str | None:
    if got.dtype != want.dtype:
        return f"expected dtype {want.dtype}, got {got.dtype}"
    if got.shape != want.shape:
        return f"expected shape {list(want.shape)}, got {list(got.shape)}"
    return None


def flatten_outputs(out: object) -> Sample:
    """A model's output (tensor, tuple, list, or dataclass-like with tensors) as a flat tuple."""
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, tuple | list):
        return tuple(t for item in out for t in flatten_outputs(item))
    if isinstance(out, dict):
        return tuple(t for item in out.values() for t in flatten_outputs(item))
    raise TypeError(f"unsupported model output type {type(out).__name__}")

"""Reading and writing the tensor files that travel between stages.

Every load goes through `torch.load(weights_only=True)`, and every `.pt2` through
`check_pt2_archive`, whose checked copy is all torch's loader sees: these files may come from
users, and a pickle from outside must never execute code. Files are serialized in memory and
then written atomically: torch names the zip's inner folder after the file it writes, so writing
a temp file directly would put its random name into the bytes, and the same inputs would not
give the same file.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from qnn_common import serde_speed
from qnn_common.atomic import atomic_write_bytes
from qnn_common.errors import ArtifactError
from qnn_common.hashing import sha256_file
from qnn_common.llm_spec import LLM_CUSTOM_OPS_MODULE
from qnn_common.pt2_archive import MODEL, check_pt2_archive

Sample = tuple[torch.Tensor, ...]

# Leaf values an input structure may hold besides tensors: what torch.export takes as a
# (specialized) constant input and what torch.load(weights_only=True) rebuilds.
_CONSTANT_TYPES = (bool, int, float, type(None))

# Marks a file of structured samples (see save_samples); a bare list is the flat format.
_STRUCTURED_KEY = "qnn_inputs"
_STRUCTURED_VERSION = 1


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
    float, bool, None), else what is wrong and where (`where` names `value`)."""
    if isinstance(value, (torch.Tensor, *_CONSTANT_TYPES)):
        return None
    if isinstance(value, tuple | list):
        for i, item in enumerate(value):
            if (problem := check_structure(item, f"{where}[{i}]")) is not None:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where} has a {type(key).__name__} key {key!r}; dict keys must be str"
            if (problem := check_structure(item, f"{where}[{key!r}]")) is not None:
                return problem
        return None
    return (
        f"{where} is a {type(value).__name__}; inputs may nest tuples, lists and str-keyed dicts "
        "of tensors, int, float, bool and None"
    )


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
    if not path.is_file():
        raise ArtifactError(path, "does not exist")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # pickle, zip and weights_only errors share no base class
        raise ArtifactError(
            path, f"cannot be read as a tensor file with torch.load(weights_only=True): {err}"
        ) from None


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
                if got.dtype != want.dtype:
                    return f"sample {i} input {j}: expected dtype {want.dtype}, got {got.dtype}"
                if got.shape != want.shape:
                    return (
                        f"sample {i} input {j}: expected shape {list(want.shape)}, "
                        f"got {list(got.shape)}"
                    )
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
            if got.dtype != want.dtype:
                return f"sample {i} input {j}: expected dtype {want.dtype}, got {got.dtype}"
            if got.shape != want.shape:
                return (
                    f"sample {i} input {j}: expected shape {list(want.shape)}, "
                    f"got {list(got.shape)}"
                )
    return None


_OP_LIBRARIES = (
    "torchao.quantization.pt2e", "torchao.quantization.quant_primitives", LLM_CUSTOM_OPS_MODULE,
)


@dataclass(frozen=True, eq=False)
class SavedProgram:
    """A program as `save_program` wrote it: the object, and the sha256 of the bytes written.

    A stage returns the programs it saved (`PrepareOutput.programs`, `QuantizeOutput.programs`)
    and a chained run hands them to the next stage's input: `load_program(path, saved)` then
    returns the object, while the file still holds those bytes, instead of rebuilding it (for
    MiniLM 8a8w, torch.export.load of its two programs was 0.8-1.2 s of a ~27 s run). The file is
    the contract all the same: it is written, sealed and verified, and a stage run alone reads it.
    The stage given the object owns it and may change it (lowering does).
    """

    program: torch.export.ExportedProgram
    sha256: str


def save_program(path: Path, program: torch.export.ExportedProgram) -> SavedProgram:
    """Save an ExportedProgram (.pt2) atomically; the same program gives the same bytes.

    Gives the nodes renumbered copies of their provenance metadata (see _stable_provenance).
    The caller must not change the program after saving if it hands the result on.
    """
    _stable_provenance(program)
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    data = buffer.getvalue()
    atomic_write_bytes(path, data)
    return SavedProgram(program, hashlib.sha256(data).hexdigest())


def handed_on(saved: Mapping[str, SavedProgram]) -> dict[str, SavedProgram]:
    """The programs of `saved` a next stage may take in memory: those sharing no tensor with
    another one.

    Programs saved from one model share its tensors: a causal LM's prefill and decode methods
    hold the same weights and KV-cache buffers, which calibrating one of them mutates. Loaded
    from their files they are independent, so such programs are loaded from disk (measured:
    otherwise the quantized decode program's saved KV cache differed from a standalone run's).
    """
    storages = {name: _storages(s.program) for name, s in saved.items()}
    return {
        name: s for name, s in saved.items()
        if not any(storages[name] & other for o, other in storages.items() if o != name)
    }


def share_equal_weights(programs: Mapping[str, torch.export.ExportedProgram]) -> int:
    """Give each weight of a later program that equals the same-named weight of an earlier one
    (shape, dtype and values) the earlier one's tensor; return the bytes that frees.

    A model's methods (a causal LM's prefill and decode) exported together hold one set of
    weights; saved and loaded as separate files, each holds a copy (SmolLM2: its 0.54 GB of fp32
    weights twice, or its quantized ones, which PT2E registers as buffers). Weights are the
    parameters, the constants and the buffers no method updates: a buffer that one method
    writes (a KV cache) is state, and stays each method's own.
    """
    written = {fqn for program in programs.values() for fqn in _buffers_written(program)}
    first: dict[tuple[str, str], torch.Tensor] = {}
    freed = 0
    for program in programs.values():
        signature = program.graph_signature
        for kind, names, table in (
            ("state", [*signature.parameters,
                       *(b for b in signature.buffers if b not in written)], program.state_dict),
            ("constant", list(program.constants), program.constants),
        ):
            for name in names:
                tensor = table.get(name)
                if not isinstance(tensor, torch.Tensor):
                    continue
                known = first.setdefault((kind, name), tensor)
                if known is tensor or known.shape != tensor.shape or known.dtype != tensor.dtype:
                    continue
                if torch.equal(known, tensor):
                    table[name] = known
                    freed += tensor.numel() * tensor.element_size()
    return freed


def _buffers_written(program: torch.export.ExportedProgram) -> set[str]:
    """The buffers a program may write: those its signature says it mutates, and those an op
    takes as an aliased argument (an in-place update, or a view one could update through).
    Programs keep in-place writes until edge conversion functionalizes them, so the signature
    alone does not tell."""
    signature = program.graph_signature
    written = set(signature.buffers_to_mutate.values())
    for node in program.graph.nodes:
        fqn = signature.inputs_to_buffers.get(node.name) if node.op == "placeholder" else None
        if fqn is None:
            continue
        for user in node.users:
            if user.op == "output":
                continue
            schema = getattr(user.target, "_schema", None) if user.op == "call_function" else None
            if schema is None:  # not an ATen op: assume the worst
                written.add(fqn)
                break
            arguments = {a.name: a for a in schema.arguments}
            uses = [schema.arguments[i] for i, a in enumerate(user.args)
                    if a is node and i < len(schema.arguments)]
            uses += [arguments[k] for k, a in user.kwargs.items() if a is node and k in arguments]
            if len(uses) == 0 or any(a.alias_info is not None for a in uses):
                written.add(fqn)
                break
    return written


def _storages(program: torch.export.ExportedProgram) -> frozenset[int]:
    """Where the program's weights, buffers and constants live in memory."""
    tensors = [*program.state_dict.values(), *program.constants.values()]
    return frozenset(
        t.untyped_storage().data_ptr() for t in tensors
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() != 0
    )


def _stable_provenance(program: torch.export.ExportedProgram) -> None:
    """Replace the graph ids in `node.meta["from_node"]` by their order of appearance.

    torch records `id(graph)`, a memory address, for every graph a node came from (PT2E
    quantization adds several); saved as is, the same program gives different bytes in every
    process. The ids only tell graphs apart, which the renumbering keeps.

    The nodes get renumbered copies of their provenance; the NodeSource objects themselves are
    left alone, since other programs may share them (a program lowered by
    `qnn_compile.lower_program` shares them with its edge program). A source shared by several
    nodes is copied once and stays shared. The bytes are those of the former in-place renumbering
    (same order of appearance): MiniLM's programs saved before and after are identical.
    """
    from torch.fx.traceback import NodeSource

    numbers: dict[int, int] = {}
    copies: dict[int, NodeSource] = {}

    def renumbered(source: NodeSource) -> NodeSource:
        known = copies.get(id(source))
        if known is not None:
            return known
        new = copy.copy(source)
        info = source.node_info
        if info is not None and isinstance(info.graph_id, int):
            new.node_info = NodeSource.NodeInfo(
                info.name, info.target, numbers.setdefault(info.graph_id, len(numbers))
            )
        new._dict = None  # to_dict() caches the old id
        copies[id(source)] = new  # before the parents: numbered in the order they were before
        new.from_node = [renumbered(parent) for parent in source.from_node or ()]
        return new

    for module in program.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                sources = node.meta.get("from_node", None)
                if sources:
                    node.meta["from_node"] = [
                        renumbered(s) if isinstance(s, NodeSource) else s for s in sources
                    ]


def load_program(
    path: Path, saved: SavedProgram | None = None
) -> torch.export.ExportedProgram:
    """Load a .pt2 written by torch.export.save, refusing anything else with a clear reason.

    Refused before torch sees it: any archive that would make torch.export.load unpickle more
    than plain tensors (see qnn_common.pt2_archive), since unpickling can run arbitrary code.
    `saved`: the program as its stage saved it in this process (`SavedProgram`), returned as is
    if the file still holds exactly those bytes.
    """
    if not path.is_file():
        raise ArtifactError(path, "does not exist")
    if saved is not None and sha256_file(path) == saved.sha256:
        return saved.program
    with path.open("rb") as file:
        checked = check_pt2_archive(path, file)
    # A PT2E-quantized program holds quantized_decomposed / torchao ops, a causal LM exported
    # with custom ops ExecuTorch's `llama` ops: their op libraries must be registered before
    # deserialization, or a fresh process (a stage run alone) can't load it.
    for library in _OP_LIBRARIES:
        with contextlib.suppress(ImportError):
            importlib.import_module(library)
    serde_speed.install()
    # torch.export.load is load_pt2 plus two fallbacks, neither wanted on a file from outside: on
    # a RuntimeError it logs the traceback and retries the archive in the pre-2.7 format, which
    # unpickles its state dict with a weights_only=False retry of its own.
    from torch.export.pt2_archive._package import load_pt2

    try:
        program = load_pt2(io.BytesIO(checked.archive)).exported_programs[MODEL]
        program.example_inputs = checked.example_inputs  # checked against the input spec
    except Exception as err:  # zipfile, JSON and deserialization errors alike
        raise ArtifactError(
            path,
            f"is not an exported program ({type(err).__name__}: {err}); "
            "produce one with torch.export.save(torch.export.export(model, inputs), path)",
        ) from None
    return program


def flatten_outputs(out: object) -> Sample:
    """A model's output (tensor, tuple, list, or dataclass-like with tensors) as a flat tuple."""
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, tuple | list):
        return tuple(t for item in out for t in flatten_outputs(item))
    if isinstance(out, dict):
        return tuple(t for item in out.values() for t in flatten_outputs(item))
    raise TypeError(f"unsupported model output type {type(out).__name__}")

"""Reading and writing the tensor files that travel between stages.

Every load goes through `torch.load(weights_only=True)`: these files may come from users, and a
pickle from outside must never execute code.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Sequence
from pathlib import Path

import torch

from qnn_common.errors import ArtifactError
from qnn_common.manifest import atomic_save

Sample = tuple[torch.Tensor, ...]


def save_samples(path: Path, samples: Sequence[Sample]) -> None:
    """Save a non-empty list of input (or output) tuples atomically (weights_only-loadable)."""
    if not samples:
        raise ArtifactError(path, "refusing to write an empty sample list")
    for i, sample in enumerate(samples):
        if not isinstance(sample, tuple) or not all(isinstance(t, torch.Tensor) for t in sample):
            raise ArtifactError(path, f"sample {i} is not a tuple of tensors")
    # Contiguous CPU clones: a view would drag its whole base storage into the file.
    data = [tuple(t.detach().cpu().contiguous().clone() for t in s) for s in samples]
    atomic_save(path, lambda tmp: torch.save(data, tmp))


def load_samples(path: Path, *, like: Sample | None = None) -> list[Sample]:
    """Load samples saved by `save_samples`, or a user file of the same shape.

    Accepted forms: one tensor (one single-input sample), a tuple of tensors (one sample), or a
    list of either. With `like`, every sample must match its count, dtypes and shapes. Anything
    else raises ArtifactError naming the file, the sample and what was expected.
    """
    if not path.is_file():
        raise ArtifactError(path, "does not exist")
    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # pickle, zip and weights_only errors share no base class
        raise ArtifactError(
            path, f"cannot be read as a tensor file with torch.load(weights_only=True): {err}"
        ) from None
    samples = _normalize(path, data)
    if like is not None and (problem := sample_mismatch(samples, like)) is not None:
        raise ArtifactError(path, f"{problem}; regenerate the file with the model's input shapes")
    return samples


def _normalize(path: Path, data: object) -> list[Sample]:
    if isinstance(data, torch.Tensor):
        return [(data,)]
    if isinstance(data, tuple) and data and all(isinstance(t, torch.Tensor) for t in data):
        return [data]
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


_QUANT_OP_LIBRARIES = ("torchao.quantization.pt2e", "torchao.quantization.quant_primitives")


def save_program(path: Path, program: torch.export.ExportedProgram) -> None:
    """Save an ExportedProgram (.pt2) atomically."""
    atomic_save(path, lambda tmp: torch.export.save(program, tmp))


def load_program(path: Path) -> torch.export.ExportedProgram:
    """Load a .pt2 written by torch.export.save, refusing anything else with a clear reason."""
    if not path.is_file():
        raise ArtifactError(path, "does not exist")
    # A PT2E-quantized program holds quantized_decomposed / torchao ops: their op libraries must
    # be registered before deserialization, or a fresh process (a stage run alone) can't load it.
    for library in _QUANT_OP_LIBRARIES:
        with contextlib.suppress(ImportError):
            importlib.import_module(library)
    try:
        return torch.export.load(path)
    except Exception as err:  # zipfile, JSON and deserialization errors alike
        raise ArtifactError(
            path,
            f"is not an exported program ({type(err).__name__}: {err}); "
            "produce one with torch.export.save(torch.export.export(model, inputs), path)",
        ) from None


def flatten_outputs(out: object) -> Sample:
    """A model's output (tensor, tuple, list, or dataclass-like with tensors) as a flat tuple."""
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, tuple | list):
        return tuple(t for item in out for t in flatten_outputs(item))
    if isinstance(out, dict):
        return tuple(t for item in out.values() for t in flatten_outputs(item))
    raise TypeError(f"unsupported model output type {type(out).__name__}")

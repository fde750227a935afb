"""Reading and writing the tensor files that travel between stages.

Every load goes through `torch.load(weights_only=True)`: these files may come from users, and a
pickle from outside must never execute code.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from qnn_common.errors import ArtifactError, ConfigValidationError
from qnn_common.manifest import atomic_save

Sample = tuple[torch.Tensor, ...]


def save_samples(path: Path, samples: Sequence[Sample]) -> None:
    """Save a list of input (or output) tuples atomically."""
    atomic_save(path, lambda tmp: torch.save([tuple(s) for s in samples], tmp))


def load_samples(path: Path, *, like: Sample | None = None) -> list[Sample]:
    """Load samples saved by `save_samples`, or a user file of the same shape.

    Accepted forms: one tensor (one single-input sample), a tuple of tensors (one sample), or a
    list of either. With `like`, every sample must match its count, dtypes and shapes.
    """
    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise ArtifactError(path, "does not exist") from None
    except Exception as err:  # torch raises many types for foreign or corrupt files
        raise ArtifactError(
            path, f"cannot be read as a tensor file with torch.load(weights_only=True): {err}"
        ) from None
    samples = _normalize(path, data)
    if like is not None:
        for i, sample in enumerate(samples):
            check_sample(sample, like, f"{path} sample {i}")
    return samples


def _normalize(path: Path, data: object) -> list[Sample]:
    if isinstance(data, torch.Tensor):
        return [(data,)]
    if isinstance(data, tuple) and all(isinstance(t, torch.Tensor) for t in data):
        return [data]
    if isinstance(data, list) and data:
        out: list[Sample] = []
        for i, item in enumerate(data):
            if isinstance(item, torch.Tensor):
                out.append((item,))
            elif isinstance(item, tuple | list) and all(isinstance(t, torch.Tensor) for t in item):
                out.append(tuple(item))
            else:
                raise ArtifactError(path, f"item {i} is {type(item).__name__}, not tensors")
        return out
    raise ArtifactError(
        path, "expected a tensor, a tuple of tensors, or a non-empty list of those"
    )


def check_sample(sample: Sample, like: Sample, where: str) -> None:
    """Raise ConfigValidationError unless `sample` matches `like` in count, dtype and shape."""
    if len(sample) != len(like):
        raise ConfigValidationError(
            where, f"{len(sample)} tensors", f"the model takes {len(like)} inputs"
        )
    for j, (got, want) in enumerate(zip(sample, like, strict=True)):
        if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
            raise ConfigValidationError(
                f"{where} input {j}",
                f"{got.dtype} {list(got.shape)}",
                f"expected {want.dtype} {list(want.shape)}; regenerate the file with those shapes",
            )


def save_program(path: Path, program: torch.export.ExportedProgram) -> None:
    """Save an ExportedProgram (.pt2) atomically."""
    atomic_save(path, lambda tmp: torch.export.save(program, tmp))


def load_program(path: Path) -> torch.export.ExportedProgram:
    """Load a .pt2 written by torch.export.save, refusing anything else with a clear reason."""
    if not path.is_file():
        raise ArtifactError(path, "does not exist")
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

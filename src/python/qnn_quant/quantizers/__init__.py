"""One PT2E quantizer per backend, looked up by the target's backend."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from qnn_common.errors import BackendNotAvailableError
from qnn_common.recipes import Backend
from qnn_quant.quantizers.spec import QuantizerSpec


class QuantizerProvider(Protocol):
    """A backend module's entry point: the torchao PT2E quantizer for `spec`, annotating `gm`."""

    def __call__(self, spec: QuantizerSpec, gm: torch.fx.GraphModule) -> Any: ...


def _provider(backend: Backend) -> QuantizerProvider:
    # Imported lazily (torchao and executorch quantizers take seconds); returned as a
    # QuantizerProvider, so mypy checks each module's entry point against it.
    # Portable runs the standard quantized_decomposed q/dq representation XNNPACK's quantizer
    # produces; its kernels then compute exactly what fake quant computes.
    if backend in (Backend.XNNPACK, Backend.PORTABLE):
        from qnn_quant.quantizers import xnnpack

        return xnnpack.quantizer
    if backend is Backend.QNN:
        from qnn_quant.quantizers import qnn

        return qnn.quantizer
    raise BackendNotAvailableError(f"no quantizer for backend {backend!r}")


def dynamic_scale_per_row(backend: Backend) -> bool:
    """Whether `backend`'s kernels give a dynamically quantized activation one scale per row
    (XNNPACK's qd8 GEMMs: per token) rather than the one per tensor the program's ops choose
    (portable runs those ops as they are)."""
    return backend is Backend.XNNPACK


def decomposed_before_annotation(backend: Backend) -> tuple[torch._ops.OpOverload, ...]:
    """The ops `backend`'s quantizer needs decomposed before it annotates.

    QNN: `affine_grid_generator` has no QNN annotation, so it stayed float and edge conversion
    decomposed it after quantization; its last transpose then carried the next quantize's
    encoding with a float input, which QNN's op validation refuses (a CPU island between two
    partitions). Decomposed first, its matmul and views are annotated like any others, and the
    base grid it builds from literals is folded at compile (qnn_compile.constant_subgraphs).
    """
    if backend is Backend.QNN:
        return (torch.ops.aten.affine_grid_generator.default,)
    return ()


def quantizer_for(spec: QuantizerSpec, gm: torch.fx.GraphModule) -> Any:
    """The quantizer that prepares `gm` for `spec.target` at `spec.recipe`."""
    return _provider(spec.target.backend)(spec, gm)

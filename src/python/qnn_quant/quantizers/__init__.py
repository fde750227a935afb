"""One module per backend, each providing its `QuantBackend` (`backend.py`): the PT2E quantizer,
and what else quantization does differently there. Looked up by the target's backend; a new
backend's module is registered in `QUANT_BACKENDS` below."""

from __future__ import annotations

from typing import Any

import torch

from qnn_common.errors import BackendNotAvailableError
from qnn_common.recipes import Backend
from qnn_quant.quantizers import portable, qnn, xnnpack
from qnn_quant.quantizers.backend import QuantBackend, QuantizerProvider
from qnn_quant.quantizers.spec import QuantizerSpec

# Each module imports torchao and ExecuTorch's quantizers only when its quantizer is called.
QUANT_BACKENDS: dict[Backend, QuantBackend] = {
    Backend.XNNPACK: xnnpack.BACKEND,
    Backend.PORTABLE: portable.BACKEND,
    Backend.QNN: qnn.BACKEND,
}


def quant_backend(backend: Backend) -> QuantBackend:
    """What quantization does for `backend`."""
    found = QUANT_BACKENDS.get(backend)
    if found is None:
        raise BackendNotAvailableError(f"no quantizer for backend {backend!r}")
    return found


def dynamic_scale_per_row(backend: Backend) -> bool:
    """Whether `backend`'s kernels give a dynamically quantized activation one scale per row
    rather than the one per tensor the program's ops choose (`QuantBackend`)."""
    return quant_backend(backend).dynamic_scale_per_row


def decomposed_before_annotation(backend: Backend) -> tuple[torch._ops.OpOverload, ...]:
    """The ops `backend`'s quantizer needs decomposed before it annotates (`QuantBackend`)."""
    return quant_backend(backend).decomposed_before_annotation


def quantizer_for(spec: QuantizerSpec, gm: torch.fx.GraphModule) -> Any:
    """The quantizer that prepares `gm` for `spec.target` at `spec.recipe`."""
    return quant_backend(spec.target.backend).quantizer(spec, gm)


__all__ = [
    "QUANT_BACKENDS",
    "QuantBackend",
    "QuantizerProvider",
    "decomposed_before_annotation",
    "dynamic_scale_per_row",
    "quant_backend",
    "quantizer_for",
]

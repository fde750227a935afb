"""What the quantize stage does differently per backend (`QuantBackend`): the one type every
backend's quantizer module provides, apart from the lookup of those modules
(`qnn_quant.quantizers`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from qnn_quant.quantizers.spec import QuantizerSpec


class QuantizerProvider(Protocol):
    """A backend's quantizer: the torchao PT2E quantizer for `spec`, annotating `gm`."""

    def __call__(self, spec: QuantizerSpec, gm: torch.fx.GraphModule) -> Any: ...


@dataclass(frozen=True)
class QuantBackend:
    """One backend's part of quantization; each field's reason is given where it is set.

    `quantizer` imports torchao and ExecuTorch's quantizers (seconds) only when called.
    `dynamic_scale_per_row`: the backend's kernels give a dynamically quantized activation one
    scale per row (per token) rather than the one per tensor the program's ops choose, so the
    fake-quant reference must too. `decomposed_before_annotation`: ops its quantizer cannot
    annotate whole, decomposed before it annotates.
    """

    quantizer: QuantizerProvider
    dynamic_scale_per_row: bool = False
    decomposed_before_annotation: tuple[torch._ops.OpOverload, ...] = ()

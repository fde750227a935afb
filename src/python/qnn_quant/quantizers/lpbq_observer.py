"""The 16a4w_block weight observer: LPBQ block scales as the HTP will hold them, on all 16 levels.

ExecuTorch 1.5.1's per-block config observes each block symmetrically on -7..7, with float block
scales, and its QNN builder later rounds each block scale to a 4-bit multiple of its channel's
largest / 16 (`node_visitor.make_qnn_per_block_config`) while keeping the integers rounded to the
float scales. Two losses follow, both fixed here:

- **-7..7 wastes a level.** A block whose values span -8..7 steps of some scale (any min/max
  int4 grid, GGUF's Q4_1 after `lpbq.split_group_offsets`) gets a scale of 8/7 steps and every
  value is rounded again. This observer uses -8..7 with torchao's SYMMETRIC_NO_CLIPPING_ERR
  scale (the larger of min / -8 and max / 7), so such a block is held exactly; QNN's signed
  4-bit encoding holds -8.
- **The fake-quantized model did not compute what the HTP does.** The scales this observer
  returns are already LPBQ's: `k * channel_max / 16`, k in 1..16, so the integers are rounded to
  the scale the HTP multiplies them by, and the builder's own rounding of these scales is exact.

Eager SmolLM2-135M with these weights (float activations, bench/lpbq_sensitivity.py) shows the
size of each; docs/llm.md has the numbers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from executorch.backends.qualcomm.quantizer.observers.per_block_param_observer import (
    PerBlockParamObserver,
)
from torchao.quantization.quant_primitives import MappingType

# QNN's blockwise expansion: per-channel float scale, per-block unsigned 4-bit multiples of it
# (what ExecuTorch 1.5.1's builder writes: `bitwidth_of_scale = 4`).
BLOCK_SCALE_BITS = 4


def lpbq_scales(scales: torch.Tensor, bits: int = BLOCK_SCALE_BITS) -> torch.Tensor:
    """Block scales (output channels on dim 0) rounded as QNN's LPBQ holds them: each a multiple
    k = 1..2**bits of its channel's largest scale / 2**bits."""
    steps = 2**bits
    flat = scales.reshape(scales.shape[0], -1)
    unit = flat.amax(dim=1, keepdim=True) / steps
    k: torch.Tensor = torch.clamp(torch.round(flat / unit), 1, steps)
    rounded: torch.Tensor = (k * unit).reshape(scales.shape)
    return rounded


# ExecuTorch is checked as Any (mypy.ini: follow_imports = skip), so subclassing its observer is
# "subclass of Any" to mypy; the observer API (forward / calculate_qparams) is what PT2E calls.
class LpbqWeightObserver(PerBlockParamObserver):  # type: ignore[misc]
    """PerBlockParamObserver on -8..7 with no clipping, returning LPBQ-rounded block scales."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mapping_type = MappingType.SYMMETRIC_NO_CLIPPING_ERR

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        scale, zero_point = super().calculate_qparams()
        return lpbq_scales(scale).to(scale.dtype), zero_point


def lpbq_weight_spec(spec: Any) -> Any:
    """ExecuTorch's per-block weight QuantizationSpec `spec` (symmetric, e.g. -7..7), observed by
    LpbqWeightObserver on its bits' full signed range (-8..7); its other keywords, e.g. eps and
    the block size, kept."""
    levels = 1 << (spec.quant_max - spec.quant_min).bit_length()  # 15 -> 16, 255 -> 256
    keywords = dict(spec.observer_or_fake_quant_ctr.p.keywords)
    return dataclasses.replace(
        spec,
        quant_min=-levels // 2,
        quant_max=levels // 2 - 1,
        observer_or_fake_quant_ctr=LpbqWeightObserver.with_args(**keywords),
    )

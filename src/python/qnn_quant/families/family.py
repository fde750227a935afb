"""What a model family of the quantize stage is (`Family`) and hands back (`Quantized`): the
types its modules implement, apart from the lookup of those modules (`qnn_quant.families`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from qnn_common.manifest import Manifest
from qnn_common.stages import QuantizeInput
from qnn_quant.gptq import GptqResult
from qnn_quant.intx import IntxResult


@dataclass(frozen=True)
class Quantized:
    """What a family hands back: the quantized methods, the fake-quant reference (its outputs
    on the eval samples, one tuple per sample), what rounded the weights, the accuracy record
    and the seconds of each step."""

    programs: dict[str, torch.export.ExportedProgram]
    fake_quant: list[tuple[torch.Tensor, ...]]
    weights: GptqResult | IntxResult | None
    accuracy: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)


class Family(Protocol):
    def check(self, source: Path, src: Manifest) -> None:
        """Refuse, with ArtifactError saying why, a prepared artifact (at `source`, its
        manifest `src`) this family cannot quantize: before its methods are loaded."""
        ...

    def quantize(
        self, inp: QuantizeInput, src: Manifest,
        programs: dict[str, torch.export.ExportedProgram],
    ) -> Quantized:
        """Quantize `programs` (the prepared artifact's methods, by name) for `inp.config`."""
        ...

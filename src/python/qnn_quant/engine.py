"""One quantization engine: a program's methods (a dict; a single program is a dict of one),
quantized by the handler registered for the recipe's kind, calibrated the way the model's
family says.

A handler lives beside what it implements and registers itself there
(`qnn_quant.handlers.register_handler`), as torchao's `register_quantize_module_handler` does:

- `RecipeKind.STATIC` (`qnn_quant.static`): PT2E with the backend's quantizer. Activation
  scales come from calibration, GPTQ rounds weights where the recipe uses it, and methods that
  are one program at several shapes (a causal LM's prefill and decode) share one set of scales.
- `RecipeKind.DYNAMIC` (`qnn_quant.dynamic`): torchao's 8da4w weight transform. Activation
  scales are chosen per token at run time; calibration texts only choose a causal LM's
  smoothed blocks.

Handlers take the `QuantizeConfig` whole (its per-layer recipe table included) and the family's
`Calibration`. A new kind of recipe is a module that registers its handler
(`qnn_quant.handlers.register_handler`), imported here (add-a-recipe.md, beside this module).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.export import ExportedProgram

from qnn_common.config import DEFAULT_LPBQ_BLOCK, QuantizeConfig
from qnn_common.errors import ConfigValidationError
from qnn_common.layer_recipes import LayerRecipe
from qnn_common.recipes import Recipe, WeightRounding
from qnn_common.target import Target
from qnn_common.torchio.samples import ModelInputs
from qnn_common.weight_groups import (
    DEFAULT_EMBEDDING_WEIGHTS,
    DEFAULT_GROUP_SIZE,
    EmbeddingWeights,
    GroupMapping,
)

# Imported for their side effect: each registers its handler (qnn_quant.handlers).
from qnn_quant import dynamic, static  # noqa: F401  # unused names, used modules
from qnn_quant.calibration import Calibration, program_calibration
from qnn_quant.handlers import WeightsRecord, handler_for


def quantize_methods(
    programs: dict[str, ExportedProgram], cfg: QuantizeConfig, calibration: Calibration,
) -> tuple[dict[str, ExportedProgram], WeightsRecord]:
    """Quantize a program's methods at `cfg` with the handler of its recipe (module docstring);
    progress is shown as `calibration` says.

    `programs` is consumed, so that a caller keeping nothing else holds no float weight once the
    quantized methods exist (a 1B decoder's fp32 weights are 5 GB)."""
    if not programs:
        raise ConfigValidationError("programs", {}, "nothing to quantize: no method given")
    return handler_for(cfg.recipe)(programs, cfg, calibration)


def quantize_program(
    ep: ExportedProgram,
    *,
    target: Target,
    recipe: Recipe,
    calibration: Sequence[tuple[torch.Tensor, ...] | ModelInputs],
    per_channel: bool = True,
    block_size: int = DEFAULT_LPBQ_BLOCK,
    progress: bool = True,
    keep_float: Sequence[str] | None = None,
    weight_rounding: WeightRounding | None = None,
    dynamic_layers: Sequence[str] | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    group_mapping: GroupMapping | None = None,
    int8_weights: Sequence[str] | None = None,
    embedding_weights: EmbeddingWeights = DEFAULT_EMBEDDING_WEIGHTS,
    layer_recipes: Sequence[LayerRecipe] = (),
) -> ExportedProgram:
    """One program quantized for `target` at `recipe`, calibrated on `calibration` (a sample is
    a tuple of positional arguments, or `ModelInputs` for a program that takes keyword ones): the
    engine over a dict of one, for library callers. The options are `QuantizeConfig`'s fields
    (docs/configuration.md says what each does), checked as the config checks them. `ep` is
    left as it was."""
    cfg = QuantizeConfig(
        backend=target.backend, recipe=recipe, soc=None if target.soc is None else target.soc.name,
        per_channel=per_channel, block_size=block_size, keep_float=_tuple(keep_float),
        weight_rounding=weight_rounding, dynamic_layers=_tuple(dynamic_layers),
        group_size=group_size, group_mapping=group_mapping, int8_weights=_tuple(int8_weights),
        embedding_weights=embedding_weights, layer_recipes=tuple(layer_recipes),
    )
    program, _ = quantize_one(ep, cfg, calibration, progress=progress)
    return program


def quantize_one(
    ep: ExportedProgram, cfg: QuantizeConfig,
    calibration: Sequence[tuple[torch.Tensor, ...] | ModelInputs], *, progress: bool = True,
) -> tuple[ExportedProgram, WeightsRecord]:
    """One program quantized at `cfg`, calibrated on `calibration` (none for 8da4w): the engine
    over a dict of one; the program, and what rounded its weights."""
    quantized, record = quantize_methods(
        {"forward": ep}, cfg, program_calibration(ep, calibration, progress=progress))
    return quantized["forward"], record


def _tuple(patterns: Sequence[str] | None) -> tuple[str, ...] | None:
    """Patterns as the config holds them (a lone string is one pattern)."""
    if patterns is None:
        return None
    return (patterns,) if isinstance(patterns, str) else tuple(patterns)

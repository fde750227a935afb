"""The handler of static recipes (`handlers.RecipeKind.STATIC`): PT2E over every method.

Per method: the float graph (`pt2e.float_graph`), its layer plan (`layers.plan_layers`: float,
dynamic and per-layer recipes), GPTQ where the recipe rounds before the quantizer runs
(`weight_rounding`), the backend's observers (`pt2e.prepare_program`), one calibration pass
through all methods together, and conversion. Methods that are one program at several shapes
(`Calibration.shared_scales`: a causal LM's prefill and decode) then share one set of scales:
every observer of a later method takes the statistics of its counterpart in the first
(`shared_scales.share_observers`), so the methods agree on every tensor they pass each other
(the KV cache) and their quantized weights are the same bytes, which the program holds once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch.export import ExportedProgram

from qnn_common.config import QuantizeConfig
from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import Recipe
from qnn_common.torchio.program_state import initial_buffers_kept
from qnn_common.torchio.programs import share_equal_weights
from qnn_quant.calibration import Calibration
from qnn_quant.handlers import RecipeKind, WeightsRecord, register_handler
from qnn_quant.layers import LayerPlan, plan_layers
from qnn_quant.method_modules import share_state, written_buffers
from qnn_quant.pt2e import convert_program, float_graph, prepare_program, weight_bits
from qnn_quant.released_memory import collect_if_worth_it, weight_bytes
from qnn_quant.shared_scales import share_observers
from qnn_quant.weight_rounding import calibrate_with_rounding, round_before_prepare

log = logging.getLogger(__name__)


@register_handler(RecipeKind.STATIC)
def quantize_static(
    programs: dict[str, ExportedProgram], cfg: QuantizeConfig, calibration: Calibration,
) -> tuple[dict[str, ExportedProgram], WeightsRecord]:
    """PT2E-quantize `programs` at `cfg` (module docstring); returns the quantized methods and
    what GPTQ did (None when weights rounded to nearest)."""
    if calibration.samples == 0:
        raise ConfigValidationError("calibration", 0, "need at least one calibration sample")
    target, recipe, rounding = cfg.target, cfg.recipe, cfg.rounding
    bits = weight_bits(recipe)
    written = written_buffers(programs)
    graphs = {method: float_graph(ep, target.backend) for method, ep in programs.items()}
    share_state(graphs, written)
    plans = {
        method: plan_layers(gm, target, recipe, cfg.keep_float, cfg.dynamic_layers,
                            cfg.layer_recipes)
        for method, gm in graphs.items()
    }
    first = next(iter(programs))
    with initial_buffers_kept(*programs.values()):
        rounded = round_before_prepare(
            graphs, lambda: calibration.run(graphs, "gptq"), recipe=recipe, rounding=rounding,
            bits=bits, skip=gptq_skips(plans[first], recipe),
        )
        prepared = {
            method: prepare_program(
                ep, target=target, recipe=recipe, per_channel=cfg.per_channel,
                block_size=cfg.block_size, group_mapping=cfg.group_mapping,
                graph_module=graphs[method], plan=plans[method], int8_weights=cfg.int8_weights,
            )
            for method, ep in programs.items()
        }
        share_state(prepared, written)
        result = calibrate_with_rounding(
            prepared, lambda: calibration.run(prepared, "calibrate"), recipe=recipe,
            rounding=rounding, bits=bits, rounded=rounded,
        )
    if calibration.shared_scales:
        for method in list(prepared)[1:]:
            share_observers(prepared[first], prepared[method])
    graphs.clear()  # the float modules: their weights go with the programs below
    float_bytes = weight_bytes(programs.values())
    example = [] if calibration.example is None else [calibration.example]
    quantized = {
        method: convert_program(
            programs.pop(method), prepared.pop(method), target=target, recipe=recipe,
            samples=example,
        )
        for method in list(programs)
    }
    if len(quantized) > 1:
        # Same scales, same rounding: a later method's quantized weights are the first's values,
        # converted and exported apart; one copy is kept (a 1B decoder's are over 1 GB).
        freed = share_equal_weights(quantized)
        log.info("quantized methods share %.0f MB of equal weights", freed / 2**20)
    # The float programs popped above are reference cycles (program, graph module, graph): they
    # go at a full collection, which may not come before the reference run and the save.
    collect_if_worth_it(float_bytes)
    return quantized, result


def gptq_skips(plan: LayerPlan, recipe: Recipe) -> Callable[[torch.fx.Node], bool]:
    """The layers per-channel GPTQ leaves alone: float ones, and those the per-layer table gives
    another recipe (their grid is not the one GPTQ rounds to; they round to nearest)."""
    return lambda node: plan.recipe_of(node, recipe) is not recipe

"""The handler of dynamic recipes (`handlers.RecipeKind.DYNAMIC`): 8da4w over every method.

Nothing is calibrated: activation scales are chosen per token at run time (`qnn_quant.intx`
says what the weight transform does and why). For a causal LM the family's `smoothing` chooses,
on a few calibration texts, each norm's block factor first (`qnn_quant.smoothed_blocks`). Each
method is then transformed alone: nothing is shared but the weights, which come out the same
bytes in each. The per-layer recipe table mixes fp32 only (`qnn_common.layer_recipes`): its
entries join `keep_float`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch
from torch.export import ExportedProgram

from qnn_common.config import QuantizeConfig
from qnn_common.errors import ConfigValidationError
from qnn_common.layer_recipes import LayerRecipe
from qnn_common.recipes import Recipe
from qnn_common.weight_groups import (
    DEFAULT_INT8_WEIGHTS,
    GroupMapping,
    default_group_mapping,
)
from qnn_quant.calibration import Calibration
from qnn_quant.embedding import embedding_form, quantize_embeddings
from qnn_quant.handlers import RecipeKind, WeightsRecord, register_handler
from qnn_quant.intx import IntxResult, four_bit_linears, quantize_graph_8da4w
from qnn_quant.layers import tabled_recipes
from qnn_quant.quantized_ops import NothingQuantizedError
from qnn_quant.smoothed_blocks import BlockScale
from qnn_quant.smoothing_stats import TEXTS

log = logging.getLogger(__name__)


@register_handler(RecipeKind.DYNAMIC)
def quantize_dynamic(
    programs: dict[str, ExportedProgram], cfg: QuantizeConfig, calibration: Calibration,
) -> tuple[dict[str, ExportedProgram], WeightsRecord]:
    """8da4w-quantize `programs` at `cfg` (module docstring); returns the quantized methods and
    the transform's record."""
    keep_float = tuple(dynamic_keep_float(next(iter(programs.values())), cfg.keep_float,
                                          cfg.layer_recipes) or ())
    int8 = DEFAULT_INT8_WEIGHTS if cfg.int8_weights is None else cfg.int8_weights
    scales = None
    if cfg.smooth_blocks and calibration.smoothing is not None and calibration.samples:
        scales = calibration.smoothing(programs, cfg.group_size, four_bit_linears(
            cfg.group_size, list(keep_float), list(int8)))
    mapping = cfg.group_mapping or default_group_mapping(cfg.recipe)
    out: dict[str, ExportedProgram] = {}
    results: list[IntxResult] = []
    for method in list(programs):
        out[method], result = _quantize_method(
            programs.pop(method), method, cfg, keep_float=keep_float, int8_weights=int8,
            mapping=mapping, block_scales=scales, calibration=calibration,
        )
        results.append(result)
    first = results[0]
    total = IntxResult(
        cfg.group_size, mapping, quantized=sum(r.quantized for r in results),
        int8_weights=dict(first.int8_weights), kept_float=dict(first.kept_float),
        offset_parameters=sum(r.offset_parameters for r in results),
        embeddings=dict(first.embeddings), fused=dict(first.fused),
        smoothed=list(first.smoothed), smoothing_texts=first.smoothing_texts,
        seconds=sum(r.seconds for r in results),
    )
    return out, total


def dynamic_keep_float(
    ep: ExportedProgram, keep_float: Sequence[str] | None, layer_recipes: Sequence[LayerRecipe]
) -> Sequence[str] | None:
    """8da4w's float layers: `keep_float` (None: its default, none) plus the per-layer table's
    fp32 entries, the only ones it mixes with (`qnn_common.layer_recipes`); an entry that
    matches no layer is refused as on the other recipes."""
    if not layer_recipes:
        return keep_float
    tabled_recipes(ep.graph_module, layer_recipes)
    return (*(keep_float or ()), *(e.pattern for e in layer_recipes))


def _export(
    ep: ExportedProgram, gm: torch.fx.GraphModule
) -> ExportedProgram:
    """`gm` (the quantized `ep.module()`) exported again with `ep`'s example inputs."""
    if ep.example_inputs is None:
        raise ConfigValidationError(
            "quantize.recipe", Recipe.A8DW4.value,
            "the program carries no example inputs to export the quantized graph with; "
            "export it again with torch.export.export(...) and save it with torch.export.save",
        )
    args, kwargs = ep.example_inputs
    with torch.no_grad():
        return torch.export.export(gm, tuple(args), dict(kwargs) or None, strict=False)


def _log_result(what: str, result: IntxResult, calibration_samples: int) -> None:
    if result.smoothing_texts:
        samples = (
            f"; {result.smoothing_texts} of the {calibration_samples} calibration sample(s) of "
            "the prepared artifact chose the smoothed blocks' factors (qnn_quant.smoothed_blocks)"
        )
    else:
        samples = (
            f"; the {calibration_samples} calibration sample(s) of the prepared artifact are not "
            "used" if calibration_samples else ""
        )
    log.info(
        "%s: calibration skipped: 8da4w chooses every activation scale per token at run time%s",
        what, samples,
    )
    log.info(
        "%s: 8da4w quantized %d linear(s) in %.1f s: 4-bit weights in %s groups of %d, int8 "
        "weights for %d; %d kept float; %d fused from %d that read one input%s%s", what,
        result.quantized, result.seconds, result.mapping.value, result.group_size,
        len(result.int8_weights), len(result.kept_float), len(result.fused),
        sum(len(p) for p in result.fused.values()),
        "".join(f"\n  {path}: {why}" for path, why in sorted(result.kept_float.items())),
        "".join(f"\n  embedding {path}: {form}" for path, form in sorted(
            result.embeddings.items())),
    )


def _quantize_method(
    ep: ExportedProgram,
    method: str,
    cfg: QuantizeConfig,
    *,
    keep_float: Sequence[str],
    int8_weights: Sequence[str],
    mapping: GroupMapping,
    block_scales: Mapping[str, BlockScale] | None,
    calibration: Calibration,
) -> tuple[ExportedProgram, IntxResult]:
    """`ep` with its linears quantized to 8da4w, exported again; and what was done.

    `keep_float`: regexes over module paths of linears to leave float; `int8_weights`: those
    given int8 weights (both checked by the config). The calibration's sample count and how many
    of them chose `block_scales` only feed the log line that says what they were used for.
    Raises NothingQuantizedError when no linear could be quantized.
    """
    gm = ep.module()
    result = quantize_graph_8da4w(
        gm, group_size=cfg.group_size, keep_float=keep_float, mapping=mapping,
        int8_weights=int8_weights, block_scales=block_scales,
    )
    result.smoothing_texts = min(TEXTS, calibration.samples) if block_scales else 0
    result.embeddings = quantize_embeddings(
        gm, embedding_form(cfg.embedding_weights, cfg.group_size))
    _log_result(method, result, calibration.samples)
    if result.quantized == 0:
        raise NothingQuantizedError(cfg.target, cfg.recipe, gm, len(result.kept_float))
    return _export(ep, gm), result

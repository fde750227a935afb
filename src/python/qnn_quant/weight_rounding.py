"""Where a recipe's GPTQ runs in the PT2E flow (`static.quantize_static`, for every method of a
program alike).

Per-channel grids are known before the quantizer runs, so their GPTQ rounds the float graphs
before `prepare_pt2e` (`gptq.round_weights`), and after calibration each rounded weight's
observer is pinned to the scale GPTQ used (`gptq.pin_weight_scales`). 16a4w_block's grid is
LPBQ's block scales, which exist only once the quantizer has rewritten the graph: its GPTQ
records Hessians during the calibration itself and rounds then (`quantizers.lpbq_gptq`); its
observers already hold the scales it rounded to, so nothing is pinned.

A caller makes both calls whatever the recipe; each does nothing where it has no part.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from qnn_common.recipes import Recipe, WeightGroups, WeightRounding
from qnn_quant.gptq import GptqResult, pin_weight_scales, round_weights
from qnn_quant.released_memory import return_freed_heap


def rounds_during_calibration(recipe: Recipe) -> bool:
    """Whether `recipe`'s GPTQ rounds onto scales its quantizer chooses (LPBQ's blocks)."""
    return recipe.traits.weight_groups is WeightGroups.LPBQ


def round_before_prepare(
    graphs: Mapping[str, torch.fx.GraphModule],
    calibrate: Callable[[], None],
    *,
    recipe: Recipe,
    rounding: WeightRounding,
    bits: int,
    skip: Callable[[torch.fx.Node], bool],
) -> GptqResult | None:
    """GPTQ-round the float `graphs` per output channel (`gptq.round_weights`, `calibrate()`
    running the calibration through all of them) when `recipe` rounds before prepare; None
    when it does not, or rounds to nearest."""
    if rounding is not WeightRounding.GPTQ or rounds_during_calibration(recipe):
        return None
    result = round_weights(graphs, calibrate, bits=bits, skip=skip)
    return_freed_heap()  # the Hessians and the weights it replaced
    return result


def calibrate_with_rounding(
    prepared: Mapping[str, torch.fx.GraphModule],
    calibrate: Callable[[], None],
    *,
    recipe: Recipe,
    rounding: WeightRounding,
    bits: int,
    rounded: GptqResult | None,
) -> GptqResult | None:
    """Run `calibrate()` (the calibration of every module of `prepared`) and finish the
    recipe's GPTQ: for 16a4w_block, round the LPBQ-blocked weights from Hessians recorded
    during it; else pin the observers of the weights `rounded` (`round_before_prepare`'s
    result) rounded. Returns what GPTQ did, None if nothing."""
    if rounding is WeightRounding.GPTQ and rounds_during_calibration(recipe):
        # Imported here: the LPBQ observer is ExecuTorch's QNN quantizer's (seconds to import).
        from qnn_quant.quantizers.lpbq_gptq import round_blocked_weights

        result = round_blocked_weights(prepared, calibrate)
        return_freed_heap()  # the Hessians and the weights it replaced
        return result
    calibrate()
    if rounded is not None:
        for module in prepared.values():
            pin_weight_scales(module, rounded, bits)
    return rounded

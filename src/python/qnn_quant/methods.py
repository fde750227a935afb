"""Quantizing a program with several methods: a causal LM's prefill and decode, one set of scales.

Both methods are prepared with the same quantizer. Calibration runs text through them the way
the runtime will (`qnn_common.llm.feed`: chunks through prefill, a short tail through decode),
then every observer of decode takes the statistics of its counterpart in prefill: the two graphs
hold the same ops in the same order, and prefill has seen every position decode will see. The
methods then quantize with identical scales and zero points, so they agree on every shared tensor
(the KV cache written by one and read by the other) and their quantized weights are the same
bytes, which the .pte stores once.
"""

from __future__ import annotations

import collections
import gc
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from tqdm import tqdm

from qnn_common.config import DEFAULT_LPBQ_BLOCK
from qnn_common.errors import StageError
from qnn_common.layer_recipes import LayerRecipe
from qnn_common.llm import (
    DECODE,
    PREFILL,
    LlmSpec,
    SinkTable,
    feed,
    method_steps,
)
from qnn_common.recipes import (
    Recipe,
    WeightRounding,
    check_weight_rounding,
    default_weight_rounding,
)
from qnn_common.target import Target
from qnn_common.torchio.programs import share_equal_weights
from qnn_common.weight_groups import (
    DEFAULT_EMBEDDING_WEIGHTS,
    DEFAULT_GROUP_SIZE,
    DEFAULT_INT8_WEIGHTS,
    EmbeddingWeights,
    GroupMapping,
    default_group_mapping,
)
from qnn_quant.gptq import GptqResult
from qnn_quant.intx import IntxResult, four_bit_linears, quantize_methods_8da4w
from qnn_quant.layers import module_path, plan_layers
from qnn_quant.method_modules import module_runner, share_state, written_buffers
from qnn_quant.pt2e import (
    convert_program,
    dynamic_keep_float,
    float_graph,
    gptq_skips,
    prepare_program,
    weight_bits,
)
from qnn_quant.smoothing_stats import TEXTS, choose_block_scales
from qnn_quant.weight_rounding import calibrate_with_rounding, round_before_prepare

_STAGE = "quantize"
log = logging.getLogger(__name__)


def quantize_causal_lm(
    programs: dict[str, ExportedProgram],
    *,
    target: Target,
    recipe: Recipe,
    spec: LlmSpec,
    calibration: Sequence[torch.Tensor],
    per_channel: bool = True,
    block_size: int = DEFAULT_LPBQ_BLOCK,
    keep_float: Sequence[str] | None = None,
    progress: bool = True,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    sink: SinkTable | None = None,
    weight_rounding: WeightRounding | None = None,
    dynamic_layers: Sequence[str] | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    group_mapping: GroupMapping | None = None,
    int8_weights: Sequence[str] | None = None,
    embedding_weights: EmbeddingWeights = DEFAULT_EMBEDDING_WEIGHTS,
    smooth_blocks: bool = True,
    layer_recipes: Sequence[LayerRecipe] = (),
) -> tuple[dict[str, ExportedProgram], GptqResult | IntxResult | None]:
    """Quantize prefill and decode with shared scales, calibrating on token sequences (`rope`:
    the rotary table of a program whose cache is its inputs and outputs; `sink`: its attention
    sink's keys and values, when it has one). With GPTQ (the
    default for 4-bit weights) both methods' inputs shape one rounding of the shared weights.
    Returns the programs and what GPTQ did (None when weights rounded to nearest). 8da4w
    (`qnn_quant.intx`) calibrates no scale: with `smooth_blocks`, a few texts choose each norm's
    block factor (`qnn_quant.smoothed_blocks`), then both methods' weights are quantized alike,
    and the transform's record is returned instead. `layer_recipes`: the per-layer recipe table
    (`qnn_common.layer_recipes`), applied to both methods alike.

    With PT2E recipes `programs` is consumed: each float method leaves the dict once converted,
    and the quantized methods hold one copy of their equal weights, so a caller that keeps
    nothing else holds no float weight when it runs them (a 1B decoder's fp32 weights are 5 GB)."""
    missing = {PREFILL, DECODE} - set(programs)
    if missing:
        raise StageError(
            _STAGE, f"a causal LM needs methods {PREFILL} and {DECODE}; missing {missing}"
        )
    rounding = weight_rounding or default_weight_rounding(recipe, per_channel)
    check_weight_rounding(recipe, rounding, per_channel, "quantize.weight_rounding")
    if recipe.is_dynamic:
        keep_float = dynamic_keep_float(programs[PREFILL], keep_float, layer_recipes)
        scales = choose_block_scales(
            programs, spec=spec, calibration=calibration, group_size=group_size, rope=rope,
            eligible=four_bit_linears(
                group_size, list(keep_float or ()),
                DEFAULT_INT8_WEIGHTS if int8_weights is None else list(int8_weights),
            ),
            reset=_reset_cache,
        ) if smooth_blocks and calibration else None
        return quantize_methods_8da4w(
            programs, target=target, group_size=group_size, keep_float=keep_float,
            mapping=group_mapping or default_group_mapping(recipe), int8_weights=int8_weights,
            embedding_weights=embedding_weights, calibration_samples=len(calibration),
            block_scales=scales, smoothing_texts=min(TEXTS, len(calibration)) if scales else 0,
        )
    bits = weight_bits(recipe)

    def calibrate(modules: Mapping[str, torch.nn.Module], desc: str) -> None:
        prefill, decode = method_steps(spec, module_runner(modules, spec), rope, sink)
        for sequence in tqdm(calibration, desc=desc, unit="text", disable=not progress):
            feed(prefill, decode, sequence.tolist(), 0, spec)
            for module in modules.values():
                _reset_cache(module)

    written = written_buffers(programs)
    graphs = {method: float_graph(ep, target.backend) for method, ep in programs.items()}
    share_state(graphs, written)
    plans = {
        method: plan_layers(gm, target, recipe, keep_float, dynamic_layers, layer_recipes)
        for method, gm in graphs.items()
    }
    rounded = round_before_prepare(
        graphs, lambda: calibrate(graphs, "gptq"), recipe=recipe, rounding=rounding, bits=bits,
        skip=gptq_skips(plans[PREFILL], recipe),
    )
    prepared = {
        method: prepare_program(
            ep, target=target, recipe=recipe, per_channel=per_channel, block_size=block_size,
            group_mapping=group_mapping, graph_module=graphs[method], plan=plans[method],
            int8_weights=int8_weights,
        )
        for method, ep in programs.items()
    }
    share_state(prepared, written)
    result = calibrate_with_rounding(
        prepared, lambda: calibrate(prepared, "calibrate"), recipe=recipe, rounding=rounding,
        bits=bits, rounded=rounded,
    )
    share_observers(prepared[PREFILL], prepared[DECODE])
    graphs.clear()  # the float modules: their weights go with the programs below
    quantized = {
        method: convert_program(
            programs.pop(method), prepared.pop(method), target=target, recipe=recipe
        )
        for method in list(programs)
    }
    # Same scales, same rounding: decode's quantized weights are prefill's values, converted
    # and exported apart; one copy is kept (a 1B decoder's are over 1 GB).
    freed = share_equal_weights(quantized)
    log.info("quantized methods share %.0f MB of equal weights", freed / 2**20)
    # The float programs popped above are reference cycles (program, graph module, graph): they
    # go at a full collection, which may not come before the reference run and the save.
    gc.collect()
    return quantized, result


def _observers(gm: torch.fx.GraphModule) -> dict[tuple[str, ...], tuple[str, Any]]:
    """Observers keyed by what they observe, the same way in every method: a graph input by
    name, an op by (module path, target, how many such ops came before it), and an observer of
    a node by its source's key plus a marker and how many observers of that source came before
    it. The count matters where one tensor has several observers: a tied embedding / LM-head
    weight feeds the embedding (per-tensor) and the LM head (per-channel), and without it the
    two shared one key, so one of them was never copied."""
    keys: dict[torch.fx.Node, tuple[str, ...]] = {}
    out: dict[tuple[str, ...], tuple[str, Any]] = {}
    seen: collections.Counter[tuple[str, ...]] = collections.Counter()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            keys[node] = ("input", node.name)
        elif node.op == "call_function":
            what = (module_path(node) or "", str(node.target))
            keys[node] = (*what, str(seen[what]))
            seen[what] += 1
        elif node.op == "call_module":
            source = node.args[0] if node.args else None
            base = (*keys.get(source, ("?", str(source))), "observer") if isinstance(
                source, torch.fx.Node) else ("?", node.name)
            key = (*base, str(seen[base]))
            seen[base] += 1
            keys[node] = key
            observer = gm.get_submodule(str(node.target))
            if hasattr(observer, "calculate_qparams"):
                out[key] = (str(node.target), observer)
    return out


_FIRST_FORWARD_ATTRS = ("original_dtype", "min_val", "max_val")


def share_observers(source: torch.fx.GraphModule, dest: torch.fx.GraphModule) -> int:
    """Copy every observer's statistics from `source` (prefill) to its counterpart in `dest`.

    Observers match by the op they observe: its module path, its target and how many such ops
    came before it (and, for a tensor observed more than once, which of its observers). The
    methods may differ by a few layout ops (a `contiguous` that is a no-op for one token); every
    observer of `dest` must have a counterpart of the same type and end up with statistics, or
    this refuses. Returns the number copied.
    """
    src, dst = _observers(source), _observers(dest)
    for key, (name, observer) in dst.items():
        match = src.get(key)
        if match is None or type(match[1]) is not type(observer):
            raise StageError(
                _STAGE,
                f"observer {name} ({type(observer).__name__} of {'/'.join(key)}) has no "
                "counterpart in prefill: the methods "
                "are not one program at two shapes, so they cannot share quantization scales",
            )
        observer.load_state_dict(match[1].state_dict())
        # ExecuTorch's per-block (LPBQ) observer keeps its range and its input's dtype as plain
        # attributes its first forward sets, outside the state dict: decode's never ran, and
        # convert refuses them without these.
        for attr in _FIRST_FORWARD_ATTRS:
            if getattr(observer, attr, None) is None and getattr(match[1], attr, None) is not None:
                setattr(observer, attr, getattr(match[1], attr))
    unobserved = [
        name for name, observer in dst.values()
        if not _has_observed(observer)
    ]
    if unobserved:
        # convert_pt2e would quantize these with its default qparams (scale 1): a weight at
        # scale 1 rounds to a handful of integers and the method's logits are noise.
        raise StageError(
            _STAGE,
            f"observers {unobserved[:5]} of decode have no statistics after sharing prefill's "
            f"({len(unobserved)} in all): calibration never reached the ops they observe",
        )
    return len(dst)


def _has_observed(observer: Any) -> bool:
    """Whether a min/max observer has seen data (an unrun one holds inf, or no channels)."""
    low = getattr(observer, "min_val", None)
    if not isinstance(low, torch.Tensor):
        return True  # not a min/max observer: nothing to tell
    return low.numel() > 0 and bool(torch.isfinite(low).all())


def _reset_cache(gm: torch.nn.Module) -> None:
    """Zero the KV-cache buffers so each calibration text starts from an empty cache."""
    with torch.no_grad():
        for name, buffer in gm.named_buffers():
            if "cache" in name and buffer.is_floating_point():
                buffer.zero_()

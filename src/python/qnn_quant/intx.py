"""The 8da4w recipe: int8 activations quantized per token at run time, 4-bit grouped weights.

What ExecuTorch's own LLM export (`extension/llm/export/quantize.py`, `export_llama -qmode
8da4w`) and optimum-executorch (`--qlinear 8da4w`) do for XNNPACK: torchao's `quantize_` with
`Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
weight_granularity=PerGroup(group_size))` on every linear layer whose input size the group
divides. Each weight becomes an `IntxUnpackedToInt8Tensor` (4-bit values held in int8, one
scale per group of `group_size` input channels of each output channel); its `F.linear` chooses
the activation's scale and zero point per token (`torchao.choose_qparams_affine`), quantizes and
dequantizes it, dequantizes the weight and runs a float linear. Exported, that is the pattern
XNNPACK's partitioner turns into one qd8 x qb4w fully connected node per linear.

Nothing is calibrated: there are no static activation scales to observe. PT2E is not involved
either: torchao's config quantizes weights of `nn.Linear` modules, so each ``aten.linear`` of the
exported float graph is handed to `quantize_` as a temporary `nn.Linear` that holds its weight,
and the graph then calls `F.linear` with the quantized weight (the subclass implements
`F.linear`, not ``aten.linear``). Exporting that graph again gives an ordinary ExportedProgram:
it runs eagerly (the fake-quant reference: torchao's ops compute per token, as XNNPACK's kernels
do), saves with torch.export.save, and lowers like any other.

Each 4-bit group maps its 16 levels one of two ways (`qnn_common.weight_groups.GroupMapping`).
Asymmetric (the default): from the group's minimum to its maximum, `scale * q + minimum`, the
form of GGUF's Q4_1 and of GPTQ / AWQ checkpoints. XNNPACK's qb4w weights carry no zero point
(ExecuTorch serializes them as symmetric nibbles and per-group scales), so the group is split
exactly into a symmetric int4 weight `scale * (q - 8)`, which stays one qd8 x qb4w GEMM, and a
float constant per group, `minimum + 8 * scale`, that multiplies the sum of the group's inputs:
two small float linears beside the GEMM (the group sums, then the constants; 1/group_size of
the weight's size). On SmolLM2-135M, whose weights sit on a Q4_1 grid, that split is lossless
where a symmetric group adds a second 4-bit rounding to every weight (numbers in docs/llm.md).
Symmetric: upstream's scheme, described next. The linears `int8_weights` names (by default a
causal LM's output head) get int8 weights with one scale per output channel instead (qd8 x qc8w).

Symmetric weights are chosen with upstream's default `intx_choose_qparams_algorithm` for this recipe
(`hqq_scale_only`: HQQ fits each group's scale to the weights, the values then rounded to
nearest on it; ExecuTorch's LLM export uses it, `export_llama` too unless told otherwise).
The same float weight always gives the same quantized bytes, so a causal LM's prefill and
decode, quantized one after the other, hold identical weights, which the .pte stores once.
"""

from __future__ import annotations

import logging
import operator
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from qnn_common.weight_groups import (
    DEFAULT_GROUP_MAPPING,
    DEFAULT_INT8_WEIGHTS,
    GroupMapping,
)
from qnn_quant.fused_linears import fuse_linears_by_input
from qnn_quant.graph_params import INT4, add_param, give_quantized_weight
from qnn_quant.layers import module_path
from qnn_quant.smoothed_blocks import BlockScale, apply_scales

log = logging.getLogger(__name__)

# torchao's scale choice for this recipe in ExecuTorch's LLM export (see the module docstring).
CHOOSE_QPARAMS_ALGORITHM = "hqq_scale_only"


@dataclass
class IntxResult:
    """What the 8da4w transform did: linears quantized (int8 ones among them), those left float
    and why, the float offset parameters the asymmetric groups added, seconds."""

    group_size: int
    mapping: GroupMapping = DEFAULT_GROUP_MAPPING
    quantized: int = 0
    int8_weights: dict[str, str] = field(default_factory=dict)  # module path -> pattern
    kept_float: dict[str, str] = field(default_factory=dict)  # module path -> why
    offset_parameters: int = 0
    embeddings: dict[str, str] = field(default_factory=dict)  # module path -> form
    fused: dict[str, list[str]] = field(default_factory=dict)  # fused path -> the linears'
    smoothed: list[BlockScale] = field(default_factory=list)  # qnn_quant.smoothed_blocks
    smoothing_texts: int = 0  # calibration texts that chose the smoothed blocks' factors
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "group_size": self.group_size,
            "weight_bits": 4,
            "group_mapping": self.mapping.value,
            "activations": "int8, asymmetric, one scale per token, chosen at run time",
            "choose_qparams_algorithm": (
                CHOOSE_QPARAMS_ALGORITHM if self.mapping is GroupMapping.SYMMETRIC
                else "min/max per group"
            ),
            "linears_quantized": self.quantized,
            "linears_int8_weights": dict(sorted(self.int8_weights.items())),
            "linears_kept_float": dict(sorted(self.kept_float.items())),
            "offset_parameters": self.offset_parameters,
            "linears_fused": {
                "into": len(self.fused), "from": sum(len(p) for p in self.fused.values()),
            },
            "embeddings": dict(sorted(self.embeddings.items())),
            "smoothed_blocks": {
                s.divided[0]: {"divided": list(s.divided), "block": s.block, "size": s.size,
                               "divided_by": s.factor,
                                "output_error_ratio": s.error_ratio}
                for s in self.smoothed
            },
            "seconds": round(self.seconds, 3),
        }


def _config(group_size: int) -> Any:
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig
    from torchao.quantization.granularity import PerGroup

    return Int8DynamicActivationIntxWeightConfig(
        weight_dtype=INT4,
        weight_granularity=PerGroup(group_size),
        intx_choose_qparams_algorithm=CHOOSE_QPARAMS_ALGORITHM,
    )


def _int8_config() -> Any:
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig
    from torchao.quantization.granularity import PerAxis

    return Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int8, weight_granularity=PerAxis(0)
    )


def split_asymmetric(
    weight: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Min/max 4-bit groups of `weight` (out, in) as (q, scale, offset): int8 `q` in -8..7 of
    shape (out, in), `scale` and `offset` of shape (out, in / group_size), such that each
    weight is ``scale * q + offset`` of its group (exactly, for weights already on such a grid).
    """
    out_f, in_f = weight.shape
    groups = weight.detach().float().reshape(out_f, in_f // group_size, group_size)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    # A constant group has no range: any positive scale represents it (q = -8, offset = value).
    scale = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).eps)
    levels = torch.round((groups - low) / scale).clamp(0, 15)
    q = (levels - 8).to(torch.int8).reshape(out_f, in_f)
    return q, scale.squeeze(-1), (low + 8 * scale).squeeze(-1)


def _symmetric_int4(q: torch.Tensor, scale: torch.Tensor, group_size: int) -> nn.Parameter:
    """The torchao 8da4w weight holding exactly `q` and `scale` (no zero point)."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    tensor = IntxUnpackedToInt8Tensor(
        q, scale, torch.zeros_like(scale, dtype=torch.int8), INT4, (1, group_size),
        torch.float32, "int8_asym_per_token",
    )
    return nn.Parameter(tensor, requires_grad=False)


def _torchao_weight(weight: torch.Tensor, config: Any) -> nn.Parameter:
    from torchao.quantization import quantize_

    holder = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    holder.weight = nn.Parameter(weight.detach(), requires_grad=False)
    with torch.no_grad():
        quantize_(holder, config)
    return holder.weight


def group_sums_node(
    gm: torch.fx.GraphModule, node: torch.fx.Node, in_f: int, group_size: int, path: str
) -> torch.fx.Node:
    """A node right after linear `node` that sums its input over each group of `group_size`
    channels: a float linear with a 0/1 matrix of its own. Its own, not one shared by every
    linear: ExecuTorch copies a constant that several partitions read once per partition, each
    copy logged and followed by a check of the whole program."""
    groups = torch.arange(in_f // group_size)[:, None]
    ones = (torch.arange(in_f)[None, :] // group_size == groups).float()
    name = add_param(gm, f"{path}.group_sum", ones)
    with gm.graph.inserting_before(node):
        matrix = gm.graph.get_attr(name)
    with gm.graph.inserting_after(node):
        return gm.graph.call_function(torch.ops.aten.linear.default, (node.args[0], matrix))


def add_group_offset(
    gm: torch.fx.GraphModule, node: torch.fx.Node, offset: torch.Tensor, sums: torch.fx.Node,
    path: str,
) -> tuple[torch.fx.Node, torch.fx.Node]:
    """After linear `node`: + linear(sums, offset), the asymmetric groups' constants times
    their inputs' sums; `node`'s users read the total. The (offset linear, add) nodes."""
    graph = gm.graph
    name = add_param(gm, f"{path}.group_offset", offset)
    with graph.inserting_before(node):
        constants = graph.get_attr(name)
    with graph.inserting_after(sums if sums.prev is node else node):
        shift = graph.call_function(torch.ops.aten.linear.default, (sums, constants))
    with graph.inserting_after(shift):
        total = graph.call_function(torch.ops.aten.add.Tensor, (node, shift))
    node.replace_all_uses_with(total, delete_user_cb=lambda user: user is not total)
    return shift, total


def _linear_weight(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.fx.Node | None:
    """The constant weight (a get_attr node) of an ``aten.linear`` node, or None."""
    if node.op != "call_function" or node.target is not torch.ops.aten.linear.default:
        return None
    weight = node.args[1] if len(node.args) > 1 else None
    if not isinstance(weight, torch.fx.Node) or weight.op != "get_attr":
        return None
    return weight


def four_bit_linears(
    group_size: int, keep_float: Sequence[str], int8_weights: Sequence[str]
) -> Callable[[torch.fx.Node, torch.Tensor], bool]:
    """Whether a linear (node, weight) gets 4-bit groups: not kept float, not int8, and its input
    size a multiple of `group_size` (regexes over module paths)."""
    patterns = [re.compile(p) for p in (*keep_float, *int8_weights)]

    def four_bit(node: torch.fx.Node, weight: torch.Tensor) -> bool:
        path = module_path(node) or node.name
        return not any(p.search(path) for p in patterns) and weight.dim() == 2 and not (
            weight.shape[1] % group_size
        )

    return four_bit


def quantize_graph_8da4w(
    gm: torch.fx.GraphModule,
    *,
    group_size: int,
    keep_float: Sequence[str] = (),
    mapping: GroupMapping = DEFAULT_GROUP_MAPPING,
    int8_weights: Sequence[str] = DEFAULT_INT8_WEIGHTS,
    fuse: bool = True,
    block_scales: Mapping[str, BlockScale] | None = None,
) -> IntxResult:
    """Quantize every eligible ``aten.linear`` of `gm` to 8da4w in place (module docstring).

    A linear stays float when its module path matches a `keep_float` regex or its input size is
    not a multiple of `group_size` (the groups must tile each weight row); one whose path
    matches an `int8_weights` regex gets int8 weights per output channel. A weight that other
    nodes read as well (a tied embedding) keeps its float copy for them; the linear gets the
    quantized one under its own module path. With `fuse`, 4-bit linears that read one input
    (q / k / v, gate / up) become one first (`qnn_quant.fused_linears`; exact). `block_scales`
    (first divided constant's path -> its factor, `qnn_quant.smoothing_stats`) are applied
    before anything else (`qnn_quant.smoothed_blocks`; exact in float).
    """
    patterns = [re.compile(p) for p in keep_float]
    result = IntxResult(group_size, mapping)
    t = time.perf_counter()
    four_bit = four_bit_linears(group_size, keep_float, int8_weights)
    if block_scales:
        result.smoothed = apply_scales(gm, block_scales, group_size)
    int8_patterns = [re.compile(p) for p in int8_weights]
    if fuse:
        result.fused = fuse_linears_by_input(gm, four_bit)
    # Linears that still read one input (unfused, or a fused one's offset path) share its sums.
    group_sums: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in list(gm.graph.nodes):
        weight_node = _linear_weight(gm, node)
        if weight_node is None:
            continue
        path = module_path(node) or node.name
        weight = operator.attrgetter(str(weight_node.target))(gm)
        if any(p.search(path) for p in patterns):
            result.kept_float[path] = "keep_float"
            continue
        offset = None
        int8_match = next((p.pattern for p in int8_patterns if p.search(path)), None)
        if weight.dim() == 2 and int8_match is not None:
            result.int8_weights[path] = int8_match
            quantized = _torchao_weight(weight, _int8_config())
        elif weight.dim() != 2 or weight.shape[1] % group_size:
            result.kept_float[path] = (
                f"input size {weight.shape[-1]} is not a multiple of group_size {group_size}"
            )
            continue
        elif mapping is GroupMapping.ASYMMETRIC:
            q, scale, offset = split_asymmetric(weight, group_size)
            quantized = _symmetric_int4(q, scale, group_size)
        else:
            quantized = _torchao_weight(weight, _config(group_size))
        new_weight = give_quantized_weight(gm, node, weight_node, quantized, module_path(node))
        if new_weight is not weight_node:
            node.replace_input_with(weight_node, new_weight)
        # The quantized weight implements F.linear (torch function level): the call must reach
        # it as F.linear, or it is dispatched as aten.t + mm, which the subclass refuses.
        node.target = torch.nn.functional.linear
        result.quantized += 1
        if offset is not None:
            x = node.args[0]
            assert isinstance(x, torch.fx.Node)
            if x not in group_sums:
                group_sums[x] = group_sums_node(gm, node, weight.shape[1], group_size, path)
            add_group_offset(gm, node, offset, group_sums[x], path)
            result.offset_parameters += offset.numel()
    # No float weight is left unread: a weight only the linear read is replaced under its own
    # name, a shared one is still read by its other users. (released_memory.drop_unused_tensors
    # would also drop the parametrizations' plain tensors, which no get_attr names.)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    result.seconds = time.perf_counter() - t
    return result

"""16a4w_block (LPBQ) on QNN: which weights are blocked, and the graph they are blocked in.

LPBQ gives each output channel's weights one scale per block of input channels (the block
scales themselves 4-bit multiples of a per-channel scale). `configure` prepares a graph and a
QnnQuantizer for it:

1. **Asymmetric groups** (`GroupMapping.ASYMMETRIC`, asked for; 8da4w's default, not LPBQ's,
   `weight_groups.default_group_mapping`): each blockable
   linear's weight is split into a symmetric part, `scale * q` with q in -8..7 per block (what
   LPBQ holds), and each block's offset, `minimum + 8 * scale`, times the sum of the block's
   inputs: a 0/1 "group sum" linear and a small "group offset" linear (1/block of the weight),
   both at 8-bit weights. A weight already on such a grid (GGUF's Q4_1: SmolLM2) then loses only
   LPBQ's block-scale rounding; symmetric blocks add a second 4-bit rounding to every weight,
   which SmolLM2 does not survive (docs/known-limits.md). `qnn_quant.intx` does the same split
   for XNNPACK's 8da4w.
2. **Linears as 1x1 convolutions** (`graph_rewrites.linears_as_pointwise_convs`), as upstream's
   LLM flow runs them (`convert_linear_to_conv2d`): blocked weights on QNN's FullyConnected op
   compute garbage on the x86 emulator, on pointwise convolutions they match the fake-quantized
   model.
3. **Block sizes** for every linear-turned-convolution and every ungrouped 1x1 convolution whose
   input channels divide into blocks (`blockable`), each node with an observer of its own
   (`_own_block_observers`): `lpbq_observer.LpbqWeightObserver`, which uses all 16 int4 levels
   and returns the block scales the HTP holds. Other weights stay 4-bit per channel.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from qnn_common.weight_groups import GroupMapping
from qnn_quant.graph_params import add_param, give_fake_values, owner
from qnn_quant.graph_rewrites import linears_as_pointwise_convs
from qnn_quant.intx import add_group_offset, group_sums_node, split_asymmetric

log = logging.getLogger(__name__)


def blockable(node: torch.fx.Node, block: int) -> torch.fx.Node | None:
    """The weight of a linear, or of an ungrouped 1x1 (pointwise) 2-D convolution, whose input
    channels divide into blocks; None for any other node.

    Larger convolution windows are left per channel: QNN 2.51's emulator computes garbage for
    a blocked 3x3 convolution, both with a block spanning the window (one scale per output
    channel and input block, the only layout QNN's blockwise expansion can hold) and with
    upstream's `(1, block, 1, 1)`, where a blocked 1x1 convolution matches the fake-quantized
    model (docs/known-limits.md). Upstream blocks 1x1 convolutions: its LLMs run their linears
    as them."""
    weight = node.args[1] if node.op == "call_function" and len(node.args) > 1 else None
    if not isinstance(weight, torch.fx.Node):
        return None
    val = weight.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() < 2 or val.shape[1] % block:
        return None
    if node.target == torch.ops.aten.linear.default:
        return weight
    if node.target == torch.ops.aten.conv2d.default:
        groups = node.args[6] if len(node.args) > 6 else 1
        if groups == 1 and tuple(val.shape[2:]) == (1, 1):
            return weight
    return None


def block_sizes(
    gm: torch.fx.GraphModule, block: int, skip: frozenset[str] = frozenset()
) -> dict[str, tuple[int, ...]]:
    """Block sizes for every blockable node (and its weight) not named in `skip`: one scale
    per `block` input channels of each output channel."""
    sizes: dict[str, tuple[int, ...]] = {}
    for node in gm.graph.nodes:
        weight = blockable(node, block) if node.name not in skip else None
        if weight is not None:
            size = (1, block, *([1] * (weight.meta["val"].dim() - 2)))
            sizes[node.name] = size
            sizes[weight.name] = size
    return sizes


def split_group_offsets(
    gm: torch.fx.GraphModule, block: int, wanted: Callable[[torch.fx.Node], bool]
) -> frozenset[str]:
    """Split each constant-weight linear `wanted` holds for into a symmetric per-block weight
    plus its blocks' offsets times their input sums (module docstring), in place; the names of
    the linears added (group sums and group offsets)."""
    added: set[str] = set()
    sums_of: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.linear.default:
            continue
        weight_node = node.args[1]
        if not isinstance(weight_node, torch.fx.Node) or weight_node.op != "get_attr":
            continue
        if not wanted(node) or blockable(node, block) is None or node.meta["val"].dim() < 2:
            continue  # a 1-D input stays one linear (as in linears_as_pointwise_convs)
        holder, leaf = owner(gm, str(weight_node.target))
        weight = getattr(holder, leaf).detach()
        _, _, offset = split_asymmetric(weight, block)
        # Not rounded here: LPBQ's observer rounds once, to its own block scales (a weight on
        # a min/max grid already sits on one: `scale * q`, q in -8..7).
        symmetric = weight - offset.repeat_interleave(block, dim=1)
        before = set(gm.graph.nodes)
        name = add_param(gm, f"{weight_node.target}_symmetric", symmetric)
        with gm.graph.inserting_before(node):
            new_weight = gm.graph.get_attr(name)
        node.replace_input_with(weight_node, new_weight)
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        if x not in sums_of:
            sums_of[x] = group_sums_node(gm, node, weight.shape[1], block, node.name)
            added.add(sums_of[x].name)
        shift, _ = add_group_offset(gm, node, offset, sums_of[x], node.name)
        added.add(shift.name)
        give_fake_values(gm, node, [n for n in gm.graph.nodes if n not in before])
    if added:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return frozenset(added)


# Block sizes a checkpoint's own 4-bit min/max grid is looked for in (GGUF's Q4_1: 32).
_GRID_BLOCKS = (16, 32, 64, 128)


def min_max_grid_block(weight: torch.Tensor, blocks: tuple[int, ...] = _GRID_BLOCKS) -> int | None:
    """The smallest block size in `blocks` over which nearly every block of `weight` (out, in)
    holds at most 16 evenly spaced values from its minimum to its maximum (a min/max 4-bit grid:
    GGUF Q4_1, GPTQ checkpoints), or None. Such weights are held exactly by LPBQ only at that
    block size with asymmetric blocks."""
    for block in blocks:
        if weight.dim() != 2 or weight.shape[1] % block:
            continue
        _, scale, offset = split_asymmetric(weight, block)
        groups = weight.detach().float().reshape(*scale.shape, block)
        steps = (groups - (offset - 8 * scale).unsqueeze(-1)) / scale.unsqueeze(-1)
        on_grid = ((steps - steps.round()).abs().amax(-1) < 1e-2).float().mean()
        if float(on_grid) >= 0.99:
            return block
    return None


def _advise_on_grid(
    gm: torch.fx.GraphModule, block: int, mapping: GroupMapping, sample: int = 4
) -> None:
    """Warn when the first blockable linears' weights sit on a 4-bit min/max grid that `block`
    and `mapping` would round again (GGUF Q4_1 at the default blocks of 16, symmetric)."""
    grids: list[int | None] = []
    for node in gm.graph.nodes:
        weight = blockable(node, block)
        if node.target != torch.ops.aten.linear.default or weight is None:
            continue
        if weight.op == "get_attr":
            holder, leaf = owner(gm, str(weight.target))
            grids.append(min_max_grid_block(getattr(holder, leaf)))
        if len(grids) == sample:
            break
    if len(set(grids)) != 1 or (grid := grids[0]) is None:
        return
    if grid != block or mapping is not GroupMapping.ASYMMETRIC:
        log.warning(
            "the weights sit on a 4-bit min/max grid in blocks of %d (a GGUF Q4_1 or GPTQ "
            "checkpoint); 16a4w_block at blocks of %d, %s, rounds them a second time. Pass "
            "--block-size %d --group-mapping asymmetric to keep them (docs/quantization.md)",
            grid, block, mapping.value, grid,
        )


def _own_block_observers(quantizer: Any) -> None:
    """Give each blocked node its own weight-observer constructor, an `LpbqWeightObserver`
    (`lpbq_observer`: all 16 int4 levels, block scales as the HTP holds them).

    ExecuTorch 1.5.1's annotators write a node's block size into the keywords of the per-block
    config's observer constructor, one object shared by every blocked node, and the observers
    are built only after all nodes are annotated: every weight got the last node's block size.
    Harmless while every block was a linear's `(1, block)`; with 1x1 convolutions beside them
    a linear's 2-D weight would be observed in 4-D blocks (and a 3x3 convolution, when it was
    tried, in its successor's 1x1 blocks)."""
    from qnn_quant.quantizers.lpbq_observer import lpbq_weight_spec

    shared = quantizer._get_quant_config

    def own(node: torch.fx.Node) -> Any:
        config = shared(node)
        if getattr(config, "block_size", None) is None:
            return config
        config = copy.deepcopy(config)
        config.weight = lpbq_weight_spec(config.weight)
        return config

    quantizer._get_quant_config = own


def configure(
    quantizer: Any,
    gm: torch.fx.GraphModule,
    block: int,
    mapping: GroupMapping,
    float_nodes: frozenset[str],
    offsets_config: Any,
    int8_nodes: frozenset[str] = frozenset(),
    *,
    wanted: Callable[[torch.fx.Node], bool] | None = None,
    rules: Sequence[tuple[Callable[[torch.fx.Node], bool], Any]] = (),
) -> dict[str, tuple[int, ...]]:
    """Rewrite `gm` for LPBQ and set `quantizer`'s block sizes (module docstring); the sizes,
    empty when nothing is blockable. `offsets_config` (a QNN ModuleQConfig, 8-bit weights per
    channel) quantizes the group-sum and group-offset linears, and the `int8_nodes` linears,
    which are not blocked (a causal LM's output head: the tied embedding table, on no 4-bit
    grid, whose 4-bit blocks cost SmolLM2 more perplexity than all its other linears').
    `wanted`: the layers to block (None: every blockable one; the per-layer recipe table gives
    some layers other recipes); `rules`: the quantizer's other per-layer configs, after the
    offsets' (QnnQuantizer holds one list)."""

    def quantized(node: torch.fx.Node) -> bool:
        return (node.name not in float_nodes and node.name not in int8_nodes
                and (wanted is None or wanted(node)))

    _advise_on_grid(gm, block, mapping)
    offset_nodes: frozenset[str] = frozenset()
    if mapping is GroupMapping.ASYMMETRIC:
        offset_nodes = split_group_offsets(gm, block, quantized)
    eight_bit = offset_nodes | (int8_nodes - float_nodes)
    submodule_rules = list(rules)
    if eight_bit:
        submodule_rules.insert(0, (lambda node: node.name in eight_bit, offsets_config))
    if submodule_rules:
        quantizer.set_submodule_qconfig_list(submodule_rules)
    convs = linears_as_pointwise_convs(
        gm,
        lambda node: node.name not in offset_nodes and quantized(node)
        and blockable(node, block) is not None,
    )
    if convs:
        log.info("%d blockable linears run as 1x1 convolutions (LPBQ)", len(convs))
    unwanted = frozenset() if wanted is None else frozenset(
        n.name for n in gm.graph.nodes if n.op == "call_function" and not wanted(n)
    )
    sizes = block_sizes(gm, block, skip=eight_bit | float_nodes | unwanted)
    if sizes:
        quantizer.set_block_size_map(sizes)
        _own_block_observers(quantizer)
    return sizes

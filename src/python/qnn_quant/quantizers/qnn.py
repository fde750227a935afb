"""The Qualcomm QNN quantizer: ExecuTorch's QnnQuantizer for one SoC, at any QNN recipe.

set_default_quant_config(QuantDtype, per-channel conv and linear, MinMaxObserver activations; see
`quantizer` for why not its default observer). 16a4w_block additionally sets per-block (LPBQ)
weights on every linear and 1x1 convolution whose input channels divide into blocks of the
configured size, in the graph `qnn_quant.quantizers.lpbq` prepares for it. The per-layer recipe
table (`qnn_common.layer_recipes`) becomes per-layer configs of the same activation width, LPBQ
blocks included (a 16a8w program with some layers in blocks, or 16a4w_block with some at 16a8w).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from qnn_common.errors import ConfigValidationError
from qnn_common.llm_spec import MASK_VALUE
from qnn_common.recipes import RECIPES, Recipe, WeightGroups
from qnn_quant.quantizers import lpbq
from qnn_quant.quantizers.backend import QuantBackend
from qnn_quant.quantizers.spec import QuantizerSpec

# Recipe -> QuantDtype member name (`RecipeTraits.qnn_dtype`). Looked up by name and tested with
# `is None`: QuantDtype is an IntEnum whose use_16a16w is 0, so `if dtype:` would silently drop
# 16a16w.
QNN_DTYPES: dict[Recipe, str] = {
    r: t.qnn_dtype for r, t in RECIPES.items() if t.qnn_dtype is not None
}

# Casts from an integer to a float dtype, as export spells them.
_CASTS = (torch.ops.aten.to.dtype, torch.ops.aten._to_copy.default)


def _depends_on_input(node: torch.fx.Node) -> bool:
    """Whether `node` is computed from a graph input (runtime data), not from constants alone."""
    seen: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.op == "placeholder":  # in `ep.module()` only user inputs are placeholders
            return True
        stack.extend(current.all_input_nodes)
    return False


def _integer_casts_as_adds(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrite int -> float casts of runtime data as `x + 0.0`, which computes the same tensor.

    Works around an ExecuTorch 1.5.1 QNN lowering bug: the quantize node that follows such a cast
    is folded into the cast, and QNN's Cast then writes the integers unscaled into a quantized
    tensor (a 0/1 attention mask becomes 0 and 1.5e-5). Measured on all-MiniLM-L6-v2 16a8w: cosine
    0.004 against fp32 with the cast, 0.99 without; 8a8w fails the same way, fp16 is unaffected.
    An elementwise add with a float operand converts by value on the HTP. Casts of constants
    (a Llama's position ids) are folded before they reach QNN and are left alone: there, QNN's
    ElementWiseAdd refuses the mixed int32 / uint16 operands.
    """
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _CASTS:
            continue
        source, out = node.args[0], node.meta.get("val")
        src = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        if not (isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor)):
            continue
        if src.dtype.is_floating_point or src.dtype == torch.bool:
            continue
        if out.dtype != torch.float32 or not _depends_on_input(source):
            continue
        with gm.graph.inserting_before(node):
            add = gm.graph.call_function(torch.ops.aten.add.Tensor, (source, 0.0))
        add.meta = dict(node.meta)
        node.replace_all_uses_with(add)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm


_SOFTMAXES = (
    torch.ops.aten._safe_softmax.default,
    torch.ops.aten._softmax.default,
    torch.ops.aten.softmax.int,
)


def _constant_masks_bounded(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Clamp a constant additive attention mask at `MASK_VALUE` where it meets the scores.

    Quantized, `softmax(scores + mask)` has one scale for the sum, so its range holds the mask's
    extreme: a causal mask's -inf (QNN's decomposition of `is_causal`) or a hand-written -1e4
    left the scores a step of about 1.0 at 16 bits (docs/known-limits.md has the numbers). Past
    `MASK_VALUE` a masked score's softmax weight is already below a 16-bit recipe's resolution,
    so clamping there keeps the float model's output and gives the scores the range; the
    causal-LM task's own masks use the same value. At 8 bits the step stays about 1.0: the
    sum's 256 levels span the mask's range either way.
    """
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SOFTMAXES:
            continue
        add = node.args[0]
        if not (isinstance(add, torch.fx.Node) and add.target is torch.ops.aten.add.Tensor):
            continue
        for mask in add.args[:2]:
            if not isinstance(mask, torch.fx.Node) or _depends_on_input(mask):
                continue
            with gm.graph.inserting_before(add):
                bounded = gm.graph.call_function(
                    torch.ops.aten.clamp.default, (mask, MASK_VALUE)
                )
            bounded.meta = dict(mask.meta)
            add.replace_input_with(mask, bounded)
            changed = True
    if changed:
        gm.recompile()
    return gm



def _layer_rules(
    spec: QuantizerSpec, module_qconfig: Any, quant_dtype: Any, observer: Any
) -> list[tuple[Callable[[torch.fx.Node], bool], Any]]:
    """QnnQuantizer's per-layer configs for the per-layer recipe table: one rule per recipe the
    table gives other than the model's (fp32 layers are discarded nodes), matching the layers
    whose recipe it is, in the table's order."""
    rules: list[tuple[Callable[[torch.fx.Node], bool], Any]] = []
    for recipe in dict.fromkeys(e.recipe for e in spec.layer_recipes):
        if recipe in (spec.recipe, Recipe.FP32):
            continue
        config = module_qconfig(
            getattr(quant_dtype, QNN_DTYPES[recipe]), is_conv_per_channel=spec.per_channel,
            is_linear_per_channel=spec.per_channel, act_observer=observer,
        )
        rules.append((_taking(spec, recipe), config))
    return rules


def _taking(spec: QuantizerSpec, recipe: Recipe) -> Callable[[torch.fx.Node], bool]:
    """Whether a node is quantized at `recipe` (a function per recipe: a lambda in the loop
    would see the loop's last recipe)."""
    return lambda node: spec.recipe_of(node) is recipe


@contextlib.contextmanager
def _no_qnn_sdk_download() -> Iterator[None]:
    """Stop QnnQuantizer's constructor from trying to download the Qualcomm SDK.

    Building the quantizer probes the SDK for op constraints and, with QNN_SDK_ROOT unset,
    downloads the SDK from the internet first. Quantization does not need it (the probe falls
    back to no constraint checks), and these machines have no internet. An empty QNN_SDK_ROOT
    means "the caller manages the SDK"; it is set only for the constructor, and the setup module's
    "done" flag it leaves behind is reset so a later compile still sets the SDK up normally.
    """
    if "QNN_SDK_ROOT" in os.environ:
        yield
        return
    from executorch.backends.qualcomm.utils import qnn_sdk_setup

    was_ready = qnn_sdk_setup._sdk_ready
    os.environ["QNN_SDK_ROOT"] = ""
    try:
        yield
    finally:
        os.environ.pop("QNN_SDK_ROOT", None)
        qnn_sdk_setup._sdk_ready = was_ready


def quantizer(spec: QuantizerSpec, gm: torch.fx.GraphModule) -> Any:
    """QnnQuantizer for the target's SoC at the recipe: per-channel conv / linear by default."""
    recipe, soc = spec.recipe, spec.target.soc
    assert soc is not None  # Target guarantees a SoC for qnn
    from executorch.backends.qualcomm.quantizer.quantizer import (
        ModuleQConfig,
        QnnQuantizer,
        QuantDtype,
    )
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    from torchao.quantization.pt2e import MinMaxObserver

    dtype_name = QNN_DTYPES.get(recipe)
    if dtype_name is None:
        raise ConfigValidationError(
            "quantize.recipe",
            recipe.value,
            "no QNN quantization dtype for it",
            allowed=tuple(r.value for r in QNN_DTYPES),
        )
    quant_dtype = getattr(QuantDtype, dtype_name)
    try:
        chipset = QcomChipset(soc.chipset_id)
    except ValueError as err:
        raise ConfigValidationError(
            "soc", soc.name, "this ExecuTorch build does not know that SoC"
        ) from err
    with _no_qnn_sdk_download():
        quantizer = QnnQuantizer(soc_model=chipset)
    # MinMaxObserver, not QnnQuantizer's default MovingAverageMinMaxObserver: that one (made for
    # QAT) moves 1 % per batch towards new extremes, so after a short calibration it holds
    # roughly the first sample's range and clips the rest. Measured on tiny-cnn, 8 calibration
    # images, scored on those same images: 16a16w 19.9 dB with it, i.e. no better than 8a8w.
    # Upstream's QNN LLM export passes MinMaxObserver too.
    quantizer.set_default_quant_config(
        quant_dtype,
        is_conv_per_channel=spec.per_channel,
        is_linear_per_channel=spec.per_channel,
        act_observer=MinMaxObserver,
    )
    rules = _layer_rules(spec, ModuleQConfig, QuantDtype, MinMaxObserver)
    blocked = {r for r in (recipe, *(e.recipe for e in spec.layer_recipes))
               if r.traits.weight_groups is WeightGroups.LPBQ}
    if blocked:
        offsets_config = ModuleQConfig(
            QuantDtype.use_16a8w, is_conv_per_channel=True, is_linear_per_channel=True,
            act_observer=MinMaxObserver,
        )
        sizes = lpbq.configure(
            quantizer, gm, spec.block_size, spec.group_mapping, spec.float_nodes, offsets_config,
            spec.int8_nodes, rules=rules,
            wanted=lambda node: spec.recipe_of(node).traits.weight_groups is WeightGroups.LPBQ,
        )
        if not sizes:
            raise ConfigValidationError(
                "quantize.block_size", spec.block_size,
                "no linear layer's input size (nor any 1x1 convolution's input channels) is a "
                "multiple of it, so nothing would be block-quantized; pick a divisor of the "
                "input sizes, or 16a4w for 4-bit weights per channel",
            )
    elif rules:
        quantizer.set_submodule_qconfig_list(rules)
    if spec.float_nodes:
        quantizer.add_discard_nodes(sorted(spec.float_nodes))
    upstream_transform = quantizer.transform_for_annotation
    # An instance attribute shadows the method; prepare_pt2e looks it up on the instance.
    quantizer.transform_for_annotation = lambda gm: _constant_masks_bounded(
        upstream_transform(_integer_casts_as_adds(gm))
    )
    return quantizer


BACKEND = QuantBackend(
    quantizer=quantizer,
    # The HTP fixes every scale when its context is built: no dynamic layers to fake-quantize.
    dynamic_scale_per_row=False,
    # `affine_grid_generator` has no QNN annotation, so it stayed float and edge conversion
    # decomposed it after quantization; its last transpose then carried the next quantize's
    # encoding with a float input, which QNN's op validation refuses (a CPU island between two
    # partitions). Decomposed first, its matmul and views are annotated like any others, and
    # the base grid it builds from literals is folded at compile (qnn_compile.constant_subgraphs).
    decomposed_before_annotation=(torch.ops.aten.affine_grid_generator.default,),
)

"""Which layers of a program stay in float, and which quantize their activations at run time.

Every other layer the backend's quantizer annotates gets static quantization: scales fixed from
calibration. Layers are chosen by regular expressions searched in each node's nn.Module path.

Why some layers cannot take static 8-bit activations: BERT-family FFN down projections
(BertOutput.dense) are where a few outlier channels are written (|x| ~ 200 in all-MiniLM-L6-v2,
against a typical 1; Bondarenko et al. 2021, "Understanding and Overcoming the Challenges of
Efficient Transformer Quantization"); an int8 scale for their output is ~200x too coarse for the
rest, and the residual stream carries those channels through every residual add (BertOutput,
BertSelfOutput), the embeddings' sum and the attention scores' scale and mask adds. Measured on
all-MiniLM-L6-v2, XNNPACK 8a8w, 8 built-in calibration sentences, 8 held-out ones, seq 32,
embedding cosine vs fp32 (mean, worst): upstream's global config 0.841, 0.706; its linear / conv
only 0.936, 0.851; the global config with the six FFN down projections in float 0.830, also
their residual adds 0.984, 0.963, also the attention residual adds 0.986, 0.968, also the
embeddings 0.987, 0.964, also the attention scores 0.993, 0.977.

Dynamic quantization (XNNPACK and portable): a linear layer whose input scale is chosen per call
(`choose_qparams`) from the values it actually gets, with int8 per-channel weights. XNNPACK runs
it as its qd8-f32-qc8w GEMM, with one scale per row (token), and writes float: no requantize,
and outliers in one token do not coarsen the others. On these backends the encoder's linear
layers (`ENCODER_LINEARS`) quantize dynamically by default, the residual stream stays float, and
the down projections need no float island: on all-MiniLM-L6-v2 that is both closer to fp32
and faster than the static default with the down projections in float (docs/benchmarks.md, "MiniLM
8a8w ... dynamic encoder linears"). The HTP fixes every scale when its context is built, so
QNN has no dynamic layers (`qnn_common.recipes.check_dynamic_layers`), and no float islands
either: every layer is quantized at every recipe. A float down projection between 8-bit tensors
cannot be lowered (QNN's partitioner keeps `aten.linear` whole, then its HTP validation refuses a
float FullyConnected with fixed-point inputs, so the op is neither delegated nor decomposed), and
the HTP program must run whole. On a BERT at 8a8w the outliers then cost accuracy (the accuracy
gates report it); 16-bit activations have the range to spare: pick 16a8w there.

Post-sublayer norms (`post_sublayer_norms`): decoders with "sandwich" norms (GLM-4, Gemma 2 and 3,
OLMo 2) normalize each attention and MLP output again before it joins the residual stream. At
static 8-bit activations the norm's ops (its square, mean, rsqrt and scale multiplies) are
quantized like any others, and their rounding goes straight into the residual stream, with no
linear after it to absorb it. On a tiny seeded GLM-4 at XNNPACK 8a8w: teacher-forced SQNR vs
fp32 4.9 dB with them quantized, 17.1 dB with them float (the MLP float instead: 12.4 dB; the
attention float: 9.5). Where the backend takes float islands they stay float by default: a few
element-wise ops per sublayer, on the CPU.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from qnn_common.config import regex_list
from qnn_common.errors import ConfigValidationError
from qnn_common.layer_recipes import LayerRecipe, first_match, layer_recipe_for
from qnn_common.recipes import BACKENDS, Recipe, check_dynamic_layers
from qnn_common.target import Target
from qnn_common.weight_groups import DEFAULT_INT8_WEIGHTS

# The FFN down projections that write the outliers.
OUTLIER_LAYERS: tuple[str, ...] = (r"encoder\.layer\.\d+\.output\.dense$",)
# Also left in float on XNNPACK / portable, whose quantizer annotates adds and muls: the ops the
# outlier channels flow through.
RESIDUAL_STREAM: tuple[str, ...] = (
    r"encoder\.layer\.\d+\.output$",  # the FFN residual add (BertOutput)
    r"encoder\.layer\.\d+\.attention\.output$",  # the attention residual add (BertSelfOutput)
    r"attention\.self$",  # attention scores: scale and additive mask
    r"(^|\.)embeddings$",  # word + position + token type sum (BertEmbeddings)
)
# Quantized dynamically by default where the backend can: every linear layer of an encoder block
# (query / key / value, attention output, FFN up and down projections).
ENCODER_LINEARS: tuple[str, ...] = (r"encoder\.layer\.\d+\.",)

# The ops a dynamic quantization config annotates (XNNPACK's dynamic patterns are linear only).
_DYNAMIC_OPS = (torch.ops.aten.linear.default,)


def default_keep_float(target: Target, recipe: Recipe) -> tuple[str, ...]:
    """The layers left in float when the caller names none (the module docstring says why)."""
    if recipe.activation_bits != 8 or not BACKENDS[target.backend].float_layers_in_quantized:
        return ()
    return OUTLIER_LAYERS + RESIDUAL_STREAM


def post_sublayer_norms(gm: torch.fx.GraphModule) -> frozenset[str]:
    """Node names of the norm modules (a class named ``*Norm``) whose output goes only into
    residual adds: a sublayer's output normalized again before it joins the residual stream
    (the module docstring says why they matter). A pre-norm feeds linears (q / k / v, the MLP's
    up projections, the head), a BERT block's post-add LayerNorm the next block's linears as
    well as its adds: neither is one."""
    members: dict[str, list[torch.fx.Node]] = {}
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack") if node.op == "call_function" else None
        if not stack:
            continue
        path, kind = list(stack.values())[-1]
        if str(getattr(kind, "__name__", kind)).rsplit(".", 1)[-1].endswith("Norm"):
            members.setdefault(str(path), []).append(node)
    found: set[str] = set()
    for nodes in members.values():
        inside = {n.name for n in nodes}
        consumers = [u for n in nodes for u in n.users if u.name not in inside]
        if consumers and all(u.target == torch.ops.aten.add.Tensor for u in consumers):
            found |= inside
    return frozenset(found)


def default_dynamic_layers(target: Target, recipe: Recipe) -> tuple[str, ...]:
    """The layers quantized dynamically when the caller names none: encoder linears at 8-bit
    activations on the backends that can (XNNPACK, portable); none on QNN."""
    if recipe.activation_bits != 8 or not BACKENDS[target.backend].dynamic_activations:
        return ()
    return ENCODER_LINEARS


@dataclass(frozen=True)
class LayerPlan:
    """Node names of a graph that stay in float, those quantized dynamically, and the per-layer
    recipe table (`qnn_common.layer_recipes`) the rest are quantized by."""

    float_nodes: frozenset[str] = frozenset()
    dynamic_nodes: frozenset[str] = frozenset()
    # Read by module path, not node name, so that a layer a quantizer rewrites (LPBQ's linears
    # as convolutions) keeps its entry.
    layer_recipes: tuple[LayerRecipe, ...] = ()
    # The nodes an entry of the table matched (they take no default: int8_weights, keep_float).
    tabled_nodes: frozenset[str] = frozenset()

    def recipe_of(self, node: torch.fx.Node, base: Recipe) -> Recipe:
        """The recipe `node` is quantized at in a `base` program (fp32: left float)."""
        return node_recipe(node, base, self.float_nodes, self.layer_recipes)


def node_recipe(
    node: torch.fx.Node, base: Recipe, float_nodes: frozenset[str],
    table: Sequence[LayerRecipe],
) -> Recipe:
    """The recipe `node` is quantized at in a `base` program whose `float_nodes` stay float and
    whose per-layer table is `table` (fp32: left float)."""
    if node.name in float_nodes:
        return Recipe.FP32
    return layer_recipe_for(module_path(node), table) or base


def plan_layers(
    gm: torch.fx.GraphModule,
    target: Target,
    recipe: Recipe,
    keep_float: Sequence[str] | None = None,
    dynamic_layers: Sequence[str] | None = None,
    layer_recipes: Sequence[LayerRecipe] = (),
) -> LayerPlan:
    """Which nodes of `gm` stay float and which quantize dynamically (None: the defaults), and
    the per-layer recipes of the rest.

    A layer named by both: an explicit `keep_float` wins (the caller asked for float); the
    default one yields to dynamic quantization, which is what replaced those float islands. A
    layer `layer_recipes` names takes the recipe its first matching entry gives, whatever the
    other two say (fp32: float; any other: statically quantized at that recipe).
    Raises ConfigValidationError for bad patterns, dynamic layers on a backend without them, a
    table entry that matches no layer, and float linears on QNN.
    """
    if dynamic_layers is not None:
        check_dynamic_layers(target.backend, tuple(dynamic_layers), "quantize.dynamic_layers")
    dynamic = _nodes_under(
        gm,
        compile_patterns(
            default_dynamic_layers(target, recipe) if dynamic_layers is None else dynamic_layers,
            "quantize.dynamic_layers",
        ),
        ops=_DYNAMIC_OPS,
    )
    floats = _nodes_under(gm, compile_patterns(
        default_keep_float(target, recipe) if keep_float is None else keep_float,
        "quantize.keep_float",
    ))
    if keep_float is None:
        if default_keep_float(target, recipe):  # static 8-bit activations, float islands allowed
            floats |= post_sublayer_norms(gm)
        floats -= dynamic
    else:
        dynamic -= floats
    table = tuple(layer_recipes)
    tabled = tabled_recipes(gm, table)
    tabled_floats = {name for name, r in tabled.items() if r is Recipe.FP32}
    if keep_float is not None:
        _check_float_linears_lower(gm, target, floats - set(tabled), "quantize.keep_float",
                                   keep_float)
    _check_float_linears_lower(gm, target, tabled_floats, "quantize.layer_recipes",
                               [e.pattern for e in table if e.recipe is Recipe.FP32])
    floats = (floats - set(tabled)) | tabled_floats
    dynamic -= set(tabled)
    return LayerPlan(frozenset(floats), frozenset(dynamic), table, frozenset(tabled))


def tabled_recipes(gm: torch.fx.GraphModule, table: Sequence[LayerRecipe]) -> dict[str, Recipe]:
    """Node name -> the recipe the first matching entry of `table` gives it, for every op node
    of `gm` some entry matches. Raises ConfigValidationError for an entry no layer matches,
    naming the closest module paths: a pattern that silently matched nothing would leave the
    model at its recipe while the manifest says otherwise."""
    if not table:
        return {}
    paths = {n.name: module_path(n) for n in gm.graph.nodes if n.op == "call_function"}
    found = {name: r for name, path in paths.items()
             if (r := layer_recipe_for(path, table)) is not None}
    known = sorted({p for p in paths.values() if p})
    for entry in table:
        if not any(re.search(entry.pattern, p) for p in known):
            close = difflib.get_close_matches(entry.pattern, known, n=3, cutoff=0.3)
            raise ConfigValidationError(
                f"quantize.layer_recipes[{entry.pattern!r}]", entry.recipe.value,
                f"its pattern matches no layer of this model ({len(known)} module paths"
                + (f"; the closest: {', '.join(close)}" if close else
                   f", e.g. {', '.join(known[:3])}")
                + "); patterns are regular expressions searched in module paths",
            )
    return found


def layer_recipe_record(
    graphs: Sequence[torch.fx.Graph], table: Sequence[LayerRecipe], limit: int = 64
) -> list[dict[str, object]]:
    """What each entry of the per-layer table took, for the manifest: its pattern and recipe, and
    the module paths of the op nodes of `graphs` it is the first match for (at most `limit`
    listed, all counted)."""
    if not table:
        return []
    taken: dict[int, set[str]] = {i: set() for i in range(len(table))}
    for graph in graphs:
        for node in graph.nodes:
            path = module_path(node) if node.op == "call_function" else None
            i = first_match(path, table)
            if i is not None and path is not None:
                taken[i].add(path)
    return [
        {"pattern": entry.pattern, "recipe": entry.recipe.value,
         "layers": len(taken[i]), "module_paths": sorted(taken[i])[:limit]}
        for i, entry in enumerate(table)
    ]


def _check_float_linears_lower(
    gm: torch.fx.GraphModule, target: Target, floats: set[str], field: str,
    patterns: Sequence[str],
) -> None:
    """Refuse, before any work, a float linear layer in a quantized QNN program.

    QNN's partitioner keeps `aten.linear` whole for its FullyConnected, then the HTP refuses a
    float one between fixed-point tensors: the op is neither delegated nor decomposed and the
    compile fails. Other float ops only run on the CPU, outside the HTP graph (compile warns).
    """
    if BACKENDS[target.backend].float_layers_in_quantized or not floats:
        return
    linears = [
        module_path(n) or n.name for n in gm.graph.nodes
        if n.name in floats and n.target in _DYNAMIC_OPS
    ]
    if linears:
        raise ConfigValidationError(
            field, list(patterns),
            f"it leaves linear layer(s) {', '.join(sorted(linears)[:4])} in float, which the qnn "
            "backend cannot lower inside a quantized program (the HTP has no float "
            "FullyConnected between fixed-point tensors); quantize them (narrow the pattern) "
            "and, for range, use 16-bit activations (16a8w)",
        )


def compile_patterns(patterns: Sequence[str], field: str) -> list[re.Pattern[str]]:
    """`patterns` compiled (a lone string is one pattern); a bad one is a ConfigValidationError
    naming `field` (`qnn_common.config.regex_list`, the rule QuantizeConfig applies too)."""
    if isinstance(patterns, str):
        patterns = (patterns,)
    return [re.compile(p) for p in regex_list(field, tuple(patterns)) or ()]


def int8_linears(gm: torch.fx.GraphModule, int8_weights: Sequence[str] | None) -> frozenset[str]:
    """Names of the linear nodes of `gm` whose module path matches an `int8_weights` regex
    (None: `weight_groups.DEFAULT_INT8_WEIGHTS`, a causal LM's output head): 16a4w_block gives them
    8-bit weights per channel instead of LPBQ blocks, as 8da4w does (`qnn_quant.intx`)."""
    patterns = compile_patterns(
        DEFAULT_INT8_WEIGHTS if int8_weights is None else int8_weights, "quantize.int8_weights"
    )
    return frozenset(_nodes_under(gm, patterns, (torch.ops.aten.linear.default,)))


def module_path(node: torch.fx.Node) -> str | None:
    """The innermost nn.Module path (e.g. ``hf.encoder.layer.0.output.dense``) of a node."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path, _ = list(stack.values())[-1]
    return str(path)


def _nodes_under(
    gm: torch.fx.GraphModule, patterns: list[re.Pattern[str]], ops: Sequence[object] = ()
) -> set[str]:
    """Names of call_function nodes (of `ops`, if given) whose module path matches a pattern."""
    if not patterns:
        return set()
    names = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or (ops and node.target not in ops):
            continue
        path = module_path(node)
        if path is not None and any(p.search(path) for p in patterns):
            names.add(node.name)
    return names

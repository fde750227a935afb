"""Run a quantized program's activation quantize -> dequantize pairs as one fused op, in eager.

A converted PT2E program holds `quantized_decomposed.quantize_per_tensor` followed by
`dequantize_per_tensor` around every quantized activation. In eager PyTorch each pair is six
elementwise ops and two dtype casts (`quantized_decomposed` is written in Python), and on an
encoder they make the fake-quant forward ~5x slower than fp32. ATen's
`fake_quantize_per_tensor_affine` computes the same values in one kernel: clamp(round(x / s) +
zp, qmin, qmax), minus zp, times s. Measured bitwise identical over 786k values at int8, uint8
and 16-bit grids (tested in fused_qdq_test.py on a whole program's outputs), and ~6x faster.

Dynamically quantized activations (`qnn_quant.layers`) have the same pair in its `.tensor`
overload, with the scale and zero point a `choose_qparams` node computed: those become the same
fused op with tensor qparams (the decomposed ops read them with `.item()`, as the fused op does).

With `dynamic_per_row`, those pairs become `fake_quantize_per_row` instead: what XNNPACK's
dynamically quantized GEMMs (qd8-f32-qc8w) compute, one asymmetric int8 scale per row (token) of
the activation (ExecuTorch's XNNPACK lowering declares a linear's dynamically quantized input
with num_nonbatch_dims=1: `QuantParams._from_dynamic_input_node` in
backends/xnnpack/operators/quant_params.py), where the program's own ops choose one per tensor
(what portable computes). Not
bitwise anyone's: measured on MiniLM 8a8w (seq 128, 4 eval samples), XNNPACK's .pte agrees with
it to 26.0-33.4 dB, with the per-tensor reference to 17.5-21.1 dB, and both the .pte and it are
25.6-27.8 dB from fp32.

Used on the `.module()` copies the accuracy report and the fake-quant reference run
(`reference_module`), never on the saved program: the lowered program still receives the q/dq
pairs its backend pattern-matches.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch

_Q = "quantize_per_tensor"
_DQ = "dequantize_per_tensor"


def _is(node: torch.fx.Node, name: str, overload: str = "default") -> bool:
    return node.op == "call_function" and str(node.target) == (
        f"quantized_decomposed.{name}.{overload}"
    )


def reference_module(
    program: torch.export.ExportedProgram, *, dynamic_per_row: bool = False
) -> torch.fx.GraphModule:
    """`program.module()` with its q/dq pairs fused (`fuse_qdq_pairs`): the fake-quant model."""
    gm = program.module()
    fuse_qdq_pairs(gm, dynamic_per_row=dynamic_per_row)
    return gm


def fake_quantize_per_row(x: torch.Tensor, quant_min: int, quant_max: int) -> torch.Tensor:
    """Asymmetric fake quantization with one scale and zero point per row (last dimension):
    each row's range, widened to include 0, spread over quant_min..quant_max."""
    rows = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
    low = rows.amin(dim=1, keepdim=True).clamp(max=0)
    high = rows.amax(dim=1, keepdim=True).clamp(min=0)
    scale = ((high - low) / (quant_max - quant_min)).clamp(min=torch.finfo(torch.float32).eps)
    zero_point = torch.round(quant_min - low / scale).clamp(quant_min, quant_max)
    levels = torch.clamp(torch.round(rows / scale) + zero_point, quant_min, quant_max)
    return ((levels - zero_point) * scale).reshape(x.shape)


def fake_quantize_tensor_qparams(
    x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, quant_min: int,
    quant_max: int,
) -> torch.Tensor:
    """`fake_quantize_per_tensor_affine` with `choose_qparams`' float64 scale and int64 zero
    point, in the dtypes ATen's tensor-qparams overload takes."""
    return torch.fake_quantize_per_tensor_affine(
        x, scale.to(torch.float32), zero_point.to(torch.int32), quant_min, quant_max
    )


def fuse_qdq_pairs(gm: torch.fx.GraphModule, *, dynamic_per_row: bool = False) -> int:
    """Rewrite each dequantize(quantize(x)) with identical parameters in `gm` as one
    `fake_quantize_per_tensor_affine(x)`, in place, keeping the dequantize node's name (callers
    may have pointed at it); dynamic pairs per row with `dynamic_per_row` (see the module
    docstring). Returns how many pairs were fused."""
    fused = 0
    for dq in list(gm.graph.nodes):
        pair = _pair(dq)
        if pair is None:
            continue
        x, scale, zero_point, quant_min, quant_max = pair
        if isinstance(scale, float) and isinstance(zero_point, int):
            dq.target = torch.fake_quantize_per_tensor_affine
            dq.args = (x, scale, zero_point, quant_min, quant_max)
        elif not (isinstance(scale, torch.fx.Node) and isinstance(zero_point, torch.fx.Node)):
            continue
        elif dynamic_per_row:  # its choose_qparams is left unread, and erased below
            dq.target = fake_quantize_per_row
            dq.args = (x, quant_min, quant_max)
        else:
            dq.target = fake_quantize_tensor_qparams
            dq.args = (x, scale, zero_point, quant_min, quant_max)
        fused += 1
    _erase_unread(gm)
    if fused:
        gm.recompile()
    return fused


# What `fuse_qdq_pairs` makes of an activation's quantize -> dequantize pair.
_FUSED: tuple[Callable[..., torch.Tensor], ...] = (
    torch.fake_quantize_per_tensor_affine, fake_quantize_per_row, fake_quantize_tensor_qparams,
)


def _pair(dq: torch.fx.Node) -> tuple[object, ...] | None:
    """(x, scale, zero point, quant_min, quant_max) if `dq` dequantizes a quantize of x with the
    same parameters, in either overload (`.default`: constants; `.tensor`: run-time qparams)."""
    for overload in ("default", "tensor"):
        if not _is(dq, _DQ, overload) or dq.kwargs:
            continue
        q = dq.args[0]
        if not isinstance(q, torch.fx.Node) or not _is(q, _Q, overload) or q.kwargs:
            return None
        if tuple(dq.args[1:6]) != tuple(q.args[1:6]):
            return None
        if not all(isinstance(p, int) for p in q.args[3:5]):
            return None
        return tuple(q.args[:5])
    return None


def float_activations(
    gm: torch.fx.GraphModule, where: Callable[[torch.fx.Node], bool] = lambda node: True,
) -> int:
    """Leave in float the activations whose fused rounding `where` selects (every one by
    default), in place: each reader reads the unrounded input instead. Weights keep their
    quantization (a weight's rounding reads a constant), so the result says what the weights
    alone cost; a diagnostic (`bench/eval_peer.py --weights-only`), never a program. Returns
    how many roundings were skipped."""
    skipped = 0
    for node in list(gm.graph.nodes):
        source = _rounded_activation(node)
        if source is None or not where(node):
            continue
        node.replace_all_uses_with(source)
        skipped += 1
    if skipped:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return skipped


def _rounded_activation(node: torch.fx.Node) -> torch.fx.Node | None:
    """The float input `node` rounds, if it is an activation's rounding: a fused pair, or an
    8da4w activation's `dequantize_affine(quantize_affine(x))` (torchao's ops, unfused)."""
    if node.op != "call_function":
        return None
    if node.target in _FUSED:
        source = node.args[0]
    elif str(node.target) == "torchao.dequantize_affine.default":
        q = node.args[0]
        if not isinstance(q, torch.fx.Node) or str(q.target) != "torchao.quantize_affine.default":
            return None
        source = q.args[0]
    else:
        return None
    if not isinstance(source, torch.fx.Node) or source.op == "get_attr":
        return None  # a weight's
    return source


def _erase_unread(gm: torch.fx.GraphModule) -> None:
    """Drop the quantize nodes, and the `choose_qparams` nodes and their `getitem`s, that nothing
    reads any more (last first, so that a node's readers go before it)."""
    for node in reversed(list(gm.graph.nodes)):
        if node.users or node.op != "call_function":
            continue
        source = node.args[0] if node.target is operator.getitem and node.args else node
        if _is(node, _Q) or _is(node, _Q, "tensor") or (
            isinstance(source, torch.fx.Node) and "choose_qparams" in str(source.target)
        ):
            gm.graph.erase_node(node)


def fold_weight_dequantize(gm: torch.fx.GraphModule) -> int:
    """Compute once every dequantize whose inputs are all the module's own constants (a
    quantized weight, its scales and zero points) and read its float result instead, in place;
    returns how many were folded. The same op on the same tensors, so the same bits; a grouped
    int4 weight (8da4w) is otherwise dequantized at every call, which made the fake-quant model
    several times slower than the float one in eager. Costs the float weights' memory beside the
    integer ones: for the evaluation's copies, not for the quantize stage's report."""
    folded = 0
    for node in list(gm.graph.nodes):
        if (node.op != "call_function" or "dequantize" not in str(node.target)
                or not node.all_input_nodes
                or any(arg.op != "get_attr" for arg in node.all_input_nodes)):
            continue
        args, kwargs = torch.fx.node.map_arg(
            (node.args, node.kwargs), lambda arg: module_tensor(gm, str(arg.target)))
        with torch.no_grad():
            value = node.target(*args, **kwargs)
        name = f"_folded_dequantize_{folded}"
        gm.register_buffer(name, value, persistent=False)
        with gm.graph.inserting_before(node):
            constant = gm.graph.get_attr(name)
        node.replace_all_uses_with(constant)
        gm.graph.erase_node(node)
        folded += 1
    if folded:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return folded


def module_tensor(gm: torch.nn.Module, target: str) -> torch.Tensor:
    """The tensor a `get_attr` of `target` reads from `gm`."""
    owner, _, leaf = target.rpartition(".")
    value = getattr(gm.get_submodule(owner) if owner else gm, leaf)
    assert isinstance(value, torch.Tensor), target
    return value

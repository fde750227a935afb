"""How far a quantized program drifts from its fp32 original, overall and layer by layer.

Both programs run eagerly in PyTorch: the quantized one with its quantize/dequantize ops, i.e.
fake quant, the reference a backend's integer kernels should reproduce. Intermediate outputs are
captured by logger modules inserted after the compared nodes: one full-speed forward pass per
program and sample, which also gives the fake-quant outputs. They are matched by nn.Module path,
op and order (see `_match_layers`), not by node name: re-exporting the converted model renames
every node in execution order, so a single op a quantizer decomposes shifts the names of
everything after it (on QNN that paired unrelated tensors at -60 dB). In the quantized graph a
layer's value is read after its output quantize/dequantize pair when it has one, so the error a
layer reports includes the rounding of its own output.

torchao 0.18's numeric debugger (`prepare_for_propagation_comparison`,
`extract_results_from_loggers`, `compare_results`) instruments the same way and keeps each
logger's `nn_module_stack`, but it is not used: it pairs nodes by their oldest `from_node`
ancestor (name, graph id), which holds only while both graphs descend from one in-memory trace,
and here the fp32 program comes from a .pt2 (its graph ids renumbered at save, see
`qnn_common.torchio.programs.save_program`) and the quantized one is re-exported; it also logs
every node, views and q/dq included, and reads a quantized layer before its output q/dq, which
would change what this report measures.

Layer errors cover every position of a tensor, including padding positions that the model's
outputs later ignore: a padded encoder can show worse layer numbers than its final output.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch.export import ExportedProgram

from qnn_common.numerics import metrics
from qnn_common.torchio.program_state import initial_buffers_kept
from qnn_common.torchio.samples import flatten_outputs
from qnn_quant.fused_qdq import fuse_qdq_pairs
from qnn_quant.layers import module_path

# aten op names (OpOverload._opname) whose outputs are compared: the ops that compute something.
# Views, copies and dtype casts are left out: their error is that of their input.
COMPUTE_OPS: frozenset[str] = frozenset(
    {
        "linear", "conv1d", "conv2d", "conv3d", "convolution",
        "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
        "matmul", "mm", "bmm", "addmm", "baddbmm", "scaled_dot_product_attention",
        "add", "sub", "mul", "div", "rsqrt", "sqrt", "pow", "exp", "neg",
        "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "batch_norm",
        "_native_batch_norm_legit_no_training",
        "softmax", "_softmax", "log_softmax", "_log_softmax",
        "relu", "gelu", "silu", "sigmoid", "tanh", "hardtanh", "hardswish", "leaky_relu",
        "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
        "mean", "sum", "cat", "embedding", "linalg_vector_norm", "clamp", "clamp_min",
    }
)  # fmt: skip

_QUANTIZE_OPS = frozenset({"quantize_per_tensor", "quantize_per_channel", "quantize_affine"})
_DEQUANTIZE_OPS = frozenset(
    {"dequantize_per_tensor", "dequantize_per_channel", "dequantize_affine"}
)


def accuracy_report(
    fp32: ExportedProgram,
    quantized: ExportedProgram,
    samples: Sequence[tuple[torch.Tensor, ...]],
    *,
    top_k: int = 10,
) -> dict[str, Any]:
    """Compare `quantized` with `fp32` on `samples`; a JSON-serializable dict.

    Keys: ``num_samples``; ``vs_fp32``: `qnn_common.numerics.metrics.accuracy_record` of the
    outputs (the schema infer uses too); ``worst_layers``: the `top_k` lowest-SQNR layers ``{layer,
    node, op, sqnr_db, cosine}`` (layer = nn.Module path, or the node name if it has none);
    ``layers_compared``.
    Infinite SQNRs (no error at all) are written as the string ``"inf"`` (``"-inf"`` for a zero
    reference), since JSON has no infinity.
    """
    report, _ = accuracy_report_and_outputs(fp32, quantized, samples, top_k=top_k)
    return report


def accuracy_report_and_outputs(
    fp32: ExportedProgram,
    quantized: ExportedProgram,
    samples: Sequence[tuple[torch.Tensor, ...]],
    *,
    top_k: int = 10,
    fp32_outputs: Sequence[Sequence[torch.Tensor]] | None = None,
    dynamic_per_row: bool = False,
) -> tuple[dict[str, Any], list[tuple[torch.Tensor, ...]]]:
    """`accuracy_report`, plus the quantized program's (fake-quant) outputs on each sample.

    Each program runs once per sample, at full speed: the layers compared are captured by
    logger modules inserted after them in the graph (no interpreter), and the same pass gives
    the outputs, so a caller that also needs the fake-quant reference runs nothing again.
    `fp32_outputs` (the fp32 outputs on `samples`, e.g. the prepare stage's reference) spares
    the fp32 program's run when no layer is compared (`top_k` 0). `dynamic_per_row`: dynamically
    quantized activations get one scale per row, as the target's kernels do
    (`qnn_quant.fused_qdq`).
    """
    if not samples:
        raise ValueError("accuracy_report needs at least one sample")
    if fp32_outputs is not None and len(fp32_outputs) != len(samples):
        raise ValueError(f"{len(fp32_outputs)} fp32 outputs for {len(samples)} samples")
    q_gm = quantized.module()
    # top_k=0 asks for no per-layer view: skip capturing intermediates altogether.
    ref_gm = fp32.module() if top_k > 0 or fp32_outputs is None else None
    layers = _match_layers(ref_gm, q_gm) if top_k > 0 and ref_gm is not None else {}
    # After matching (which reads the q/dq pairs), before instrumenting: same values, ~5x faster.
    fuse_qdq_pairs(q_gm, dynamic_per_row=dynamic_per_row)
    ref_log = _instrument(ref_gm, {name: name for name in layers}) if ref_gm is not None else None
    q_log = _instrument(q_gm, {lay.read: name for name, lay in layers.items()})

    output_stats: list[metrics.ErrorStats] = []
    layer_stats = {name: metrics.ErrorStats() for name in layers}
    fake_quant: list[tuple[torch.Tensor, ...]] = []
    # Both modules share their buffers with the programs, which are saved after this.
    with torch.no_grad(), initial_buffers_kept(fp32, quantized):
        for i, sample in enumerate(samples):
            if ref_gm is not None and ref_log is not None:
                ref_out, ref_vals = _run(ref_gm, ref_log, sample)
            else:
                ref_out, ref_vals = tuple(fp32_outputs[i]) if fp32_outputs else (), {}
            q_out, q_vals = _run(q_gm, q_log, sample)
            fake_quant.append(q_out)
            if len(ref_out) != len(q_out):
                raise ValueError(
                    f"programs disagree on outputs: {len(ref_out)} vs {len(q_out)} tensors"
                )
            if not output_stats:
                output_stats = [metrics.ErrorStats() for _ in ref_out]
            for stats, r, q in zip(output_stats, ref_out, q_out, strict=True):
                stats.update(_np(r), _np(q))
            for name, stats in layer_stats.items():
                ref_val, q_val = ref_vals.get(name), q_vals.get(name)
                if ref_val is not None and q_val is not None and ref_val.shape == q_val.shape:
                    stats.update_float32(ref_val, q_val)

    compared = [(name, s) for name, s in layer_stats.items() if s.count > 0]
    compared.sort(key=lambda item: item[1].sqnr_db)
    worst = [
        {
            "layer": layers[name].path or name,
            "node": name,
            "op": layers[name].op,
            "sqnr_db": metrics.json_float(s.sqnr_db),
            "cosine": s.cosine,
        }
        for name, s in compared[: max(top_k, 0)]
    ]
    report = {
        "num_samples": len(samples),
        "vs_fp32": metrics.accuracy_record(output_stats),
        "worst_layers": worst,
        "layers_compared": len(compared),
    }
    return report, fake_quant


def _np(t: torch.Tensor) -> Any:
    return t.detach().to(torch.float64).cpu().numpy()


def _opname(node: torch.fx.Node) -> str | None:
    if node.op != "call_function":
        return None
    name = getattr(node.target, "_opname", None)
    return name if isinstance(name, str) else None


def _after_output_qdq(node: torch.fx.Node) -> torch.fx.Node:
    """The dequantize node fed by this node's own quantize node, else the node itself."""
    if len(node.users) != 1:
        return node
    (q,) = node.users
    if _opname(q) not in _QUANTIZE_OPS:
        return node
    for dq in q.users:
        if _opname(dq) in _DEQUANTIZE_OPS:
            return dq
    return node


def _after_group_offset(node: torch.fx.Node) -> torch.fx.Node:
    """For an 8da4w linear whose asymmetric groups were split (`qnn_quant.intx`), the add of
    its offset path, `add(node, linear(linear(x, group_sums), offsets))`, whose value is the
    layer's; else the node itself. The GEMM alone is only the symmetric part of the weight."""
    if len(node.users) != 1:
        return node
    (add,) = node.users
    if _opname(add) != "add" or len(add.args) != 2:
        return node
    other = add.args[1] if add.args[0] is node else add.args[0]
    if (
        isinstance(other, torch.fx.Node)
        and _opname(other) == "linear"
        and isinstance(other.args[0], torch.fx.Node)
        and _opname(other.args[0]) == "linear"
    ):
        return add
    return node


def _fused_part(node: torch.fx.Node) -> bool:
    """A slice of a fused linear's output (`qnn_quant.fused_linears`), which carries the module
    path of the linear it replaced: its value is that linear's."""
    source = node.args[0] if node.args else None
    if not isinstance(source, torch.fx.Node) or module_path(source) == module_path(node):
        return False
    if _opname(source) == "add":  # the fused linear's group offset (`_after_group_offset`)
        source = next(
            (a for a in source.args if isinstance(a, torch.fx.Node) and _opname(a) == "linear"),
            source,
        )
    return _opname(source) == "linear"


class _Layer(NamedTuple):
    read: str  # node of the quantized graph whose value is compared
    path: str | None  # nn.Module path
    op: str  # aten op name


def _compute_nodes(gm: torch.fx.GraphModule) -> dict[tuple[str, str], list[torch.fx.Node]]:
    """Compute nodes with a float output, grouped by (module path, op), in graph order."""
    groups: dict[tuple[str, str], list[torch.fx.Node]] = {}
    for node in gm.graph.nodes:
        op = _opname(node)
        if op == "slice" and _fused_part(node):
            op = "linear"
        if op is None or op not in COMPUTE_OPS:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
            continue
        groups.setdefault((module_path(node) or "", op), []).append(node)
    return groups


def _match_layers(ref_gm: torch.fx.GraphModule, q_gm: torch.fx.GraphModule) -> dict[str, _Layer]:
    """fp32 node name -> what to compare it with, for every comparable layer.

    Nodes pair up by (module path, op, position among that module's ops of that kind), and only
    where both graphs hold the same number of such ops: a module whose ops a quantizer rewrote
    (QNN decomposes scaled_dot_product_attention into matmul/add/softmax, for one) is skipped
    rather than compared against the wrong tensor.
    """
    q_groups = _compute_nodes(q_gm)
    layers: dict[str, _Layer] = {}
    for key, ref_nodes in _compute_nodes(ref_gm).items():
        q_nodes = q_groups.get(key, [])
        if len(q_nodes) != len(ref_nodes):
            continue
        path, op = key
        for ref_node, q_node in zip(ref_nodes, q_nodes, strict=True):
            read = _after_output_qdq(q_node)
            if op == "linear":
                read = _after_group_offset(read)
            layers[ref_node.name] = _Layer(read.name, path or None, op)
    return layers


class _Logger(torch.nn.Module):
    """Keeps the last tensor it was called with (under `key`) in a shared dict."""

    def __init__(self, key: str, values: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.key = key
        self.values = values

    def forward(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            self.values[self.key] = x.detach()
        return x


def _instrument(gm: torch.fx.GraphModule, wanted: dict[str, str]) -> dict[str, torch.Tensor]:
    """Insert a `_Logger` after each node named in `wanted` (node name -> key) into `gm`'s graph.

    Returns the dict the loggers fill on each run. The loggers' outputs have no users: the
    graph computes exactly what it did (nothing eliminates dead code after this).
    `gm` is a `.module()` copy that belongs to the caller.
    """
    values: dict[str, torch.Tensor] = {}
    if not wanted:
        return values
    targets = [n for n in gm.graph.nodes if n.name in wanted]
    for i, node in enumerate(targets):
        name = f"_qnn_layer_logger_{i}"
        gm.add_submodule(name, _Logger(wanted[node.name], values))
        with gm.graph.inserting_after(node):
            gm.graph.call_module(name, (node,))
    gm.recompile()
    return values


def _run(
    gm: torch.fx.GraphModule, log: dict[str, torch.Tensor], sample: tuple[torch.Tensor, ...]
) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """One forward pass on a copy of `sample` (a model may update its inputs in place): the
    outputs, flattened, and what the loggers captured."""
    log.clear()
    out = gm(*copy.deepcopy(sample))
    return flatten_outputs(out), dict(log)

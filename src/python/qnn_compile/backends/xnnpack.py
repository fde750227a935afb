"""XNNPACK: host CPU kernels for fp32 and 8a8w programs.

Two rewrites keep ops inside the delegate that XNNPACK 1.5.1's partitioner would leave to the
portable kernels (each one splits a partition, and every split is a round trip through the
runtime):

* `layer_norm` has no XNNPACK node. Before edge conversion it is decomposed into ops XNNPACK
  takes: the input viewed as ``[1, rows, features, 1]``, `mean.dim` over dims (2, 3) (XNNPACK's
  global average pooling, the only mean it accepts), `sub`, `mul`, `add`, `rsqrt`, then the
  affine weight and bias. MiniLM: its 13 layer norms.
* `mean.dim` over the last dimension (RMSNorm's mean of squares: every Llama-family decoder has
  two per layer and one before the head) is the same global average pooling on the input viewed
  as ``[1, rows, features, 1]``, viewed back. SmolLM2: 61 per method, each one split a
  partition (every split a runtime round trip per generated token).
* `expand_copy` that expands to the shape it already has: `matmul` of two 4-D tensors reaches
  the edge dialect as expand + view + bmm, and the expand is a no-op copy XNNPACK does not take
  (MiniLM: 24 of them, two per attention matmul). ExecuTorch's own `RemoveNoopExpandCopyPass`
  removes them after edge conversion; it ships with the XNNPACK backend but is not in its default
  pass list.

And one of its partitioner's checks is tightened (`_partitioner_configs`): XNNPACK's static slice
takes its input and output in one datatype, and ExecuTorch's check refuses a quantized slice
whose input and output scales differ but not one whose input is dequantized and whose one user
is a float op. Gemma 3's rotary embedding slices the normed query (QK-norm's output, quantized)
and negates the half it took, in float: serialized, that slice reads int8 and writes float, and
XNNPACK refuses the node when the program loads ("Failed to create static slice node",
xnn_status_invalid_parameter), after all the work. Such a slice runs on the portable kernels.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from qnn_common.config import CompileConfig
from qnn_compile.backends.backend import CompileBackend
from qnn_compile.backends.lowering import BackendLowering
from qnn_compile.progress import logged_partitioner, logging_partitions
from qnn_compile.shared_constants import sharing_weights_with_xnnpack
from qnn_compile.xnnpack_passes import skipping_idle_passes


def _layer_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    cudnn_enable: bool = True,  # aten.layer_norm's last argument; meaningless on the CPU
) -> torch.Tensor:
    """aten.layer_norm in ops XNNPACK delegates (see the module docstring)."""
    features = math.prod(normalized_shape)
    rows = x.numel() // features
    x4 = x.reshape(1, rows, features, 1)
    centered = x4 - x4.mean(dim=[2, 3], keepdim=True)
    variance = (centered * centered).mean(dim=[2, 3], keepdim=True)
    y = (centered * torch.rsqrt(variance + eps)).reshape(x.shape)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def _has_static_layer_norm(program: ExportedProgram) -> bool:
    """True if the graph holds a float layer_norm with a static input shape to decompose."""
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.layer_norm.default:
            val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
            if (
                isinstance(val, torch.Tensor)
                and val.dtype == torch.float32
                and all(isinstance(d, int) for d in val.shape)
            ):
                return True
    return False


def decompose_layer_norm(program: ExportedProgram) -> ExportedProgram:
    """`program` with every aten.layer_norm decomposed into XNNPACK-delegable ops.

    Only layer_norm is decomposed (`run_decompositions` with a one-entry table leaves every other
    op as it is: quantize / dequantize nodes, linear, ...). Programs with dynamic shapes keep
    their layer norms (the decomposition flattens the leading dimensions into a static size).
    """
    if not _has_static_layer_norm(program):
        return program
    decomposed: ExportedProgram = program.run_decompositions(
        {torch.ops.aten.layer_norm.default: _layer_norm}
    )
    return decomposed


def _last_dim_mean(node: torch.fx.Node) -> bool:
    """A float `mean.dim` over only the last dimension of a static-shape tensor that XNNPACK's
    own rule (4-D, dims (2, 3)) would refuse."""
    if node.op != "call_function" or node.target is not torch.ops.aten.mean.dim:
        return False
    x = node.args[0]
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dtype != torch.float32 or node.kwargs:
        return False
    if not all(isinstance(d, int) for d in val.shape) or val.dim() < 1:
        return False
    if not val.is_contiguous():  # viewed as [1, rows, features, 1] below
        return False
    dims = node.args[1] if len(node.args) > 1 else None
    if not isinstance(dims, list | tuple) or len(dims) != 1 or not isinstance(dims[0], int):
        return False
    last = dims[0] % val.dim() == val.dim() - 1
    return last and not (val.dim() == 4 and val.shape[-1] == 1)


def delegable_means(program: ExportedProgram) -> ExportedProgram:
    """`program` with every last-dimension `mean.dim` spelled as XNNPACK's global average
    pooling (module docstring): the same sum and division, inside the delegate."""
    gm = program.graph_module
    means = [n for n in gm.graph.nodes if _last_dim_mean(n)]
    if not means:
        return program
    for node in means:
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        shape = list(x.meta["val"].shape)
        keepdim = len(node.args) > 2 and bool(node.args[2])
        features = shape[-1]
        rows = math.prod(shape) // features
        aten = torch.ops.aten
        with gm.graph.inserting_before(node):
            x4 = gm.graph.call_function(aten.view.default, (x, [1, rows, features, 1]))
            pooled = gm.graph.call_function(aten.mean.dim, (x4, [2, 3], True))
            out = gm.graph.call_function(
                aten.view.default, (pooled, shape[:-1] + ([1] if keepdim else []))
            )
        # Shapes for the partitioner's checks, from the fake tensors export left (no retrace of
        # the program: on a 30-layer decoder that took ~20 s per method, and edge conversion
        # retraces it anyway).
        x4.meta["val"] = x.meta["val"].view(1, rows, features, 1)
        pooled.meta["val"] = x4.meta["val"].mean(dim=[2, 3], keepdim=True)
        out.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
    gm.recompile()
    return program


def _remove_noop_expand_copies(method: str, program: ExportedProgram) -> list[Any]:
    """Edge transform passes for `program` (one method): drop expand_copy nodes that copy."""
    from executorch.backends.xnnpack._passes.remove_noop_expand_copy_pass import (
        RemoveNoopExpandCopyPass,
    )

    return [RemoveNoopExpandCopyPass()]


@contextlib.contextmanager
def _logged_and_skipping(backend: type) -> Iterator[None]:
    """Each partition's compile logged (`qnn_compile.progress`), XNNPACK's passes that cannot
    change a partition skipped (`qnn_compile.xnnpack_passes`), and the partitions it
    preprocesses sharing the program's weights, not a copy of all of them
    (`qnn_compile.shared_constants`); the same .pte either way."""
    with logging_partitions(backend), skipping_idle_passes(), sharing_weights_with_xnnpack():
        yield


def _partitioner_configs() -> list[Any]:
    """XNNPACK's partitioner configs, its static slice's check tightened (module docstring)."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.config.generic_node_configs import SliceCopyConfig
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, is_quant

    class OneDatatypeSlice(SliceCopyConfig):  # type: ignore[misc]  # ExecuTorch is untyped
        def check_constraints(self, node: torch.fx.Node, ep: ExportedProgram) -> bool:
            if not super().check_constraints(node, ep):
                return False
            source, users = node.args[0], list(node.users)
            return not (isinstance(source, torch.fx.Node) and is_dequant(source)
                        and len(users) == 1 and not is_quant(users[0]))

    return [OneDatatypeSlice if c is SliceCopyConfig else c for c in ALL_PARTITIONER_CONFIGS]


def lowering(config: CompileConfig) -> BackendLowering:
    """Partition everything XNNPACK takes; the rest runs on the portable kernels. Partitioning
    and each partition's compile are logged as they happen (`qnn_compile.progress`)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
    from executorch.export import LoweringRecipe

    return BackendLowering(
        target=config.target,
        recipe=LoweringRecipe(
            partitioners=[logged_partitioner(XnnpackPartitioner)(configs=_partitioner_configs())],
            edge_transform_passes=[_remove_noop_expand_copies],
        ),
        aten_passes=(decompose_layer_norm, delegable_means),
        context=lambda: _logged_and_skipping(XnnpackBackend),
        record=config.target.record(),
    )


BACKEND = CompileBackend(lowering=lowering)

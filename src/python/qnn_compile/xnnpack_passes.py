"""XNNPACK's per-partition passes, without the ones that have nothing to match.

`XnnpackBackend.preprocess` (ExecuTorch 1.5.1) runs the 17 passes of `XNNPACKPassManager` on
every partition, and most of them end by retracing the partition on fake tensors whether or not
they changed anything. A decoder's partitions hold linears, norms and elementwise ops: the batch
norm, PReLU, convolution, padding, upsampling and concatenation passes find nothing in them, and
their retraces were about half of each partition's compile.

`PASS_APPLIES` says, per pass, what a graph must hold for the pass to change it: the ops it
rewrites, or for a pass that matches subgraph patterns, every op of one of its patterns (a
subgraph matcher cannot match a pattern whose op the graph lacks). Each is checked on the graph
as it is when the pass's turn comes, so a pass that creates ops for a later one (batch norm
decomposed into a convolution) still hands them over. A pass with no entry always runs. Inside
`skipping_idle_passes()` (installed, reference-counted, for the length of an XNNPACK lowering,
like `qnn_compile.partition_recompile`) the pass manager preprocess builds is one that skips the
others: the same graph reaches serialization, hence the same .pte
(`tests/llm/fast_partitioning_test.py`, on a decoder and on convolutions with batch norm).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch

from qnn_compile.scoped_patch import Replacement, ScopedPatch

Targets = frozenset[Any]


def _targets(gm: torch.fx.GraphModule) -> Targets:
    return frozenset(n.target for n in gm.graph.nodes if n.op == "call_function")


def _holds_any(ops: Callable[[], Iterable[Any]]) -> Callable[[Targets], bool]:
    return lambda present: not present.isdisjoint(set(ops()))


def _holds_a_pattern(
    patterns: Callable[[], Iterable[torch.fx.GraphModule]],
) -> Callable[[Targets], bool]:
    return lambda present: any(_targets(p) <= present for p in patterns())


def _edge(name: str) -> Callable[[], list[Any]]:
    """The edge dialect op `name` (``aten.<op>.<overload>``), resolved when asked."""

    def ops() -> list[Any]:
        from executorch.exir.dialects._ops import ops as exir_ops

        namespace, op, overload = name.split(".")
        return [getattr(getattr(getattr(exir_ops.edge, namespace), op), overload)]

    return ops


def _join(*groups: Callable[[], list[Any]]) -> Callable[[], list[Any]]:
    return lambda: [op for group in groups for op in group()]


_BATCH_NORM = _join(
    _edge("aten.native_batch_norm.default"),
    _edge("aten._native_batch_norm_legit_no_training.default"),
)


def _sdpa_patterns() -> list[torch.fx.GraphModule]:
    from executorch.backends.xnnpack.partition.graphs import sdpa

    return list(sdpa.get_graphs())  # built once (lru_cache upstream)


def _bilinear_patterns() -> list[torch.fx.GraphModule]:
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d

    return list(bilinear_2d.get_graphs_dict())


def _fuseable_activations() -> list[Any]:
    from executorch.backends.xnnpack._passes.fuse_activation_pass import FuseActivationPass

    return list(FuseActivationPass.FUSEABLE_ACTIVATIONS)


# Pass class name -> what a graph must hold for the pass to change it.
PASS_APPLIES: dict[str, Callable[[Targets], bool]] = {
    "ConvertToUpsampleBilinear2d": _holds_a_pattern(_bilinear_patterns),
    "ConvertToSDPAPass": _holds_a_pattern(_sdpa_patterns),
    "FuseBatchNormPass": _holds_any(_BATCH_NORM),
    "DecomposeBatchNorm": _holds_any(_BATCH_NORM),
    "FuseActivationPass": _holds_any(_fuseable_activations),
    "DecomposeConcatenate": _holds_any(_edge("aten.cat.default")),
    "InsertPadQDQPass": _holds_any(_edge("aten.constant_pad_nd.default")),
    "Conv1dUnsqueezePass": _holds_any(_edge("aten.convolution.default")),
    "PReLUReshapePass": _holds_any(_edge("aten._prelu_kernel.default")),
}


def _manager_class() -> type:
    from executorch.backends.xnnpack._passes import XNNPACKPassManager
    from executorch.backends.xnnpack._passes.xnnpack_pass import XNNPACKPass
    from executorch.exir.pass_base import ExportPass
    from executorch.exir.program._program import _transform

    class SkippingPassManager(XNNPACKPassManager):  # type: ignore[misc]  # untyped upstream
        """`XNNPACKPassManager` whose `transform` skips the passes `PASS_APPLIES` rules out."""

        def transform(self) -> Any:
            ep = self.exported_program
            for pass_ in self.passes:
                applies = PASS_APPLIES.get(pass_.__name__)
                if applies is not None and not applies(_targets(ep.graph_module)):
                    continue
                if issubclass(pass_, XNNPACKPass):
                    transform_pass = pass_(ep)
                elif issubclass(pass_, ExportPass):
                    transform_pass = pass_()
                else:  # as upstream's transform says
                    raise RuntimeError(f"Expecting ExportPass or XNNPACKPass, got {pass_}")
                ep = _transform(ep, transform_pass)
            return ep

    return SkippingPassManager


def _replacements() -> list[Replacement]:
    from executorch.backends.xnnpack import xnnpack_preprocess

    return [(xnnpack_preprocess, "XNNPACKPassManager", _manager_class())]


_PATCH = ScopedPatch(_replacements)


def skipping_idle_passes() -> AbstractContextManager[None]:
    """While inside, XNNPACK's preprocess runs only the passes that can change a partition."""
    return _PATCH.active()

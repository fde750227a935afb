"""A decoder's layers split into several HTP contexts per method (`--num-shards N`).

One HTP context holds at most about 4 GB on a device, so upstream splits big decoders
(`num_sharding`: Llama-3.2-3B in 3, Phi-4-mini in 8). It does so the way this module does: at
each boundary between two runs of layers, an op QNN does not take (`llama.fallback`, an identity
with a CPU kernel in ExecuTorch's LLM custom-ops library) cuts the graph, so the partitioner
makes one delegate, one context, per run of layers; the runtime calls them in turn inside the one
`.pte`. The embedding goes with the first shard and the output head with the last, as upstream's
`SplitGraph` places them.

Unlike upstream's split (boundaries every `layers // N`, which gives more than N shards when N does
not divide the layer count), the N shards here differ by at most one layer.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import torch
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from qnn_common.errors import ConfigValidationError

# Hugging Face decoders name their blocks `<...>.layers.<i>` (Llama, Qwen2, Mistral, Phi-3, ...).
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
FALLBACK_OP = "llama.fallback.default"
FALLBACK_OP_MODULE = "executorch.extension.llm.custom_ops.op_fallback"


def boundaries(num_layers: int, num_shards: int) -> list[int]:
    """The first layer of every shard but the first: N shards of near-equal layer counts."""
    if not 1 <= num_shards <= num_layers:
        raise ConfigValidationError(
            "compile.num_shards", num_shards,
            f"the decoder has {num_layers} layer(s): split it into 1..{num_layers} shards",
        )
    return [round(k * num_layers / num_shards) for k in range(1, num_shards)]


def layer_of(node: torch.fx.Node) -> int | None:
    """The decoder layer a node was traced in (its innermost `layers.<i>` module), if any."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    for path, _ in reversed(list(stack.values())):
        found = _LAYER.findall(str(path))
        if found:
            return int(found[-1])
    return None


class ShardLayers(PassBase):
    """Cut an edge graph into `num_shards` runs of decoder layers with `llama.fallback` nodes.

    Placed after QNN's FoldQDQ: the node cut carries its producer's quantization attributes, so
    both delegates agree on the tensor between them.
    """

    def __init__(self, num_shards: int) -> None:
        super().__init__()
        self.num_shards = num_shards
        self.cuts: list[int] = []  # the layers each cut precedes, once run

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        importlib.import_module(FALLBACK_OP_MODULE)  # defines the op
        from executorch.backends.qualcomm.utils.constants import QCOM_QUANT_ATTRS
        from executorch.exir.dialects._ops import ops as exir_ops

        nodes = [n for n in graph_module.graph.nodes if n.op == "call_function"]
        layers = [layer_of(n) for n in nodes]
        found = {layer for layer in layers if layer is not None}
        if not found:
            raise ConfigValidationError(
                "compile.num_shards", self.num_shards,
                "sharding splits a decoder's layers, and this program has no `layers.<i>` "
                "modules (a Hugging Face causal LM has): drop --num-shards",
            )
        starts = set(boundaries(max(found) + 1, self.num_shards))
        self.cuts = []
        previous: tuple[torch.fx.Node, int] | None = None
        for node, layer in zip(nodes, layers, strict=True):
            if layer is None:
                continue
            if previous is not None and layer in starts and previous[1] == layer - 1:
                self._cut_after(graph_module, previous[0], exir_ops, QCOM_QUANT_ATTRS)
                self.cuts.append(layer)
            previous = (node, layer)
        if len(self.cuts) != self.num_shards - 1:
            raise ConfigValidationError(
                "compile.num_shards", self.num_shards,
                f"found where to cut before layer(s) {self.cuts} only, of "
                f"{sorted(starts)}: the layers are not traced in order",
            )
        graph_module.recompile()
        return PassResult(graph_module, True)

    @staticmethod
    def _cut_after(
        graph_module: torch.fx.GraphModule, node: torch.fx.Node, exir_ops: Any, quant_key: str
    ) -> None:
        """Route every user of `node` (the last op of a layer) through a fallback node."""
        users = list(node.users)
        with graph_module.graph.inserting_after(node):
            cut = graph_module.graph.create_node(
                "call_function", exir_ops.edge.llama.fallback.default, (node,)
            )
        cut.meta["val"] = node.meta["val"]
        if node.meta.get(quant_key) is not None:
            cut.meta[quant_key] = node.meta[quant_key]
        for user in users:
            user.replace_input_with(node, cut)

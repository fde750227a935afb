"""How big each HTP context of a sharded decoder will be, before compiling it (`--num-shards auto`).

A context holds the graphs of its layers for one method (or, with weight sharing, every
method's graph in one context: `context_cache.one_context_per_method`), each graph its own copy
of the weights unless shared. So per shard's context: the weights of its layers at the recipe's
weight bits (matrices; vectors such as norms and biases at the activation width), once per graph
it holds, plus a fixed overhead per graph. The embedding table goes with the first shard, the
final norm and the output head with the last, as `shards.ShardLayers` places them. The KV cache
is the methods' inputs and outputs on the HTP (the host keeps it), so it is not in the context.
Measured on the emulator (SmolLM2-135M at 16a8w, one shard: a context per method of 196 MB, its
106 M layer weights at 8 bits, the 28 M-entry embedding table at 16 and the head at 8, plus 5 MB
of graph).

`auto` picks the fewest shards whose largest estimate fits `CONTEXT_LIMIT_BYTES`. The compile
manifest records the estimate beside the contexts' measured bytes (`delegate_bytes`), which is how
the model is checked (tests/qnn/qnn_llm_test.py).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from qnn_common.recipes import Recipe
from qnn_compile.context_cache import ContextRecord
from qnn_compile.shards import boundaries, layer_of

log = logging.getLogger(__name__)

# What one HTP context may hold on a device: about 4 GB (upstream's Llama flow splits when QNN
# reports "Failed to find available PD ... context size estimate"). Not measurable here (the x86
# emulator has no such limit), so a margin is kept below it.
CONTEXT_LIMIT_BYTES = 3_500_000_000
# A graph's own bytes in its context beyond its weights (op and tensor records, the prepared
# graph), per decoder layer it holds: fitted to the contexts measured on the emulator (tiny-llama
# 16a8w: 145 KB per graph for 2 layers; SmolLM2 16a8w: 5 MB per graph for 30 layers).
GRAPH_BYTES_PER_LAYER = 160 * 1024

FIRST, LAST = "first", "last"
# Where a tensor goes: a layer index, or the first shard (embedding) or the last (norm, head).
Place = int | str


@dataclass(frozen=True)
class Tensor:
    """A program tensor the context stores: its shape and the shard it belongs to."""

    shape: tuple[int, ...]
    place: Place


@dataclass(frozen=True)
class ShardEstimate:
    """One shard: its layers [first, end), and its context's estimated bytes."""

    first_layer: int
    end_layer: int
    weight_bytes: int  # one copy of the shard's weights
    methods: int  # graphs in the context: 1 with a context per method

    @property
    def context_bytes(self) -> int:
        layers = self.end_layer - self.first_layer
        return self.methods * (self.weight_bytes + layers * GRAPH_BYTES_PER_LAYER)

    def to_json(self) -> dict[str, Any]:
        return {"layers": [self.first_layer, self.end_layer], "weight_bytes": self.weight_bytes,
                "estimated_context_bytes": self.context_bytes}


def _bytes(t: Tensor, recipe: Recipe) -> int:
    """A tensor's bytes in the context: matrices at the weight width; vectors, and the
    embedding table (a gather's input: QNN quantizes it as an activation), at the activation
    width; fp16 recipes 16 bits for all."""
    count = 1
    for d in t.shape:
        count *= d
    as_weight = len(t.shape) >= 2 and t.place != FIRST
    bits = (recipe.weight_bits if as_weight else recipe.activation_bits) or 16
    return count * bits // 8


def program_tensors(program: Any) -> list[Tensor]:
    """The weights and constants of an ExportedProgram (fp32 or PT2E-quantized: its tensors
    lose their module names, so each is placed by the layer of the op that reads it)."""
    import torch

    values = {**program.state_dict, **program.constants}
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    found = []
    for spec in program.graph_signature.input_specs:
        tensor = values.get(spec.target) if spec.target is not None else None
        node = placeholders.get(spec.arg.name)
        if not isinstance(tensor, torch.Tensor) or node is None:
            continue
        found.append(Tensor(tuple(tensor.shape), _place(node)))
    return found


def _place(node: Any) -> Place:
    """The layer of the first op (past q / dq) reading `node`, FIRST for an embedding table."""
    frontier, seen = list(node.users), set()
    while frontier:
        user = frontier.pop(0)
        if user in seen:
            continue
        seen.add(user)
        if "embedding" in str(user.target):
            return FIRST
        layer = layer_of(user)
        if layer is not None:
            return layer
        if "quantize" in str(user.target):  # a q / dq between the tensor and its reader
            frontier.extend(user.users)
    return LAST


def estimate(
    tensors: list[Tensor], recipe: Recipe, num_layers: int, num_shards: int, methods: int = 2
) -> list[ShardEstimate]:
    """Per shard, the bytes of its tensors and its context's estimate."""
    per_layer = [0] * num_layers
    first = last = 0
    for t in tensors:
        size = _bytes(t, recipe)
        if isinstance(t.place, int) and t.place < num_layers:
            per_layer[t.place] += size
        elif t.place == FIRST:
            first += size
        else:
            last += size
    starts = [0, *boundaries(num_layers, num_shards), num_layers]
    shards = []
    for i, (a, b) in enumerate(itertools.pairwise(starts)):
        weights = sum(per_layer[a:b]) + (first if i == 0 else 0) + (
            last if i == num_shards - 1 else 0
        )
        shards.append(ShardEstimate(a, b, weights, methods))
    return shards


def pick_shards(
    tensors: list[Tensor], recipe: Recipe, num_layers: int, methods: int = 2,
    limit: int = CONTEXT_LIMIT_BYTES,
) -> tuple[int, list[ShardEstimate]]:
    """The fewest shards whose largest context estimate fits `limit`, and their estimates (at
    one shard per layer if nothing fits: the caller reports it)."""
    for n in range(1, num_layers + 1):
        shards = estimate(tensors, recipe, num_layers, n, methods)
        if max(s.context_bytes for s in shards) <= limit:
            return n, shards
    return num_layers, estimate(tensors, recipe, num_layers, num_layers, methods)


@dataclass(frozen=True)
class ShardPlan:
    """The shard count compile lowers with (`requested`: a number, or "auto"), and each
    shard's estimate."""

    requested: int | str
    count: int
    estimates: list[ShardEstimate]

    def to_json(
        self, measured: dict[str, list[int]], built: Sequence[ContextRecord] = ()
    ) -> dict[str, Any]:
        """For the manifest: the estimates beside the contexts' measured bytes (QNN puts every
        method's graph of a shard in one context, so any method's delegates are the contexts),
        and, with a context cache, each shard's build seconds or its reuse."""
        contexts = next(iter(measured.values()), [])
        shards = [
            {**e.to_json(), "measured_context_bytes": contexts[i] if i < len(contexts) else None}
            for i, e in enumerate(self.estimates)
        ]
        for i, shard in enumerate(shards):
            mine = [r for r in built if r.index == i]
            if mine:  # one context per method, or one for them all
                shard.update(reused=all(r.reused for r in mine),
                             build_s=round(sum(r.seconds for r in mine), 3))
        return {"requested": self.requested, "count": self.count,
                "context_limit_bytes": CONTEXT_LIMIT_BYTES, "shards": shards}


def plan_shards(
    requested: int | str, recipe: Recipe, program: Any, num_layers: int, methods: int
) -> ShardPlan:
    """Resolve `requested` against `program`'s tensors (a causal LM's prefill: decode holds the
    same weights), and log each shard's estimate before anything compiles."""
    tensors = program_tensors(program)
    if requested == "auto":
        count, estimates = pick_shards(tensors, recipe, num_layers, methods)
    else:
        count = int(requested)
        estimates = estimate(tensors, recipe, num_layers, count, methods)
    for i, e in enumerate(estimates):
        log.info("shard %d/%d: layers %d-%d, weights %.1f MB, context about %.1f MB",
                 i + 1, count, e.first_layer, e.end_layer - 1, e.weight_bytes / 1e6,
                 e.context_bytes / 1e6)
    largest = max(e.context_bytes for e in estimates)
    if largest > CONTEXT_LIMIT_BYTES:
        log.warning(
            "the largest shard's context is estimated at %.2f GB, above the %.1f GB a device "
            "context holds: %s", largest / 1e9, CONTEXT_LIMIT_BYTES / 1e9,
            "no split of the layers fits (the embedding or head alone is too big)"
            if requested == "auto" else "pass a larger --num-shards, or --num-shards auto",
        )
    return ShardPlan(requested, count, estimates)

"""Lowering without copying every node's provenance history in every pass.

torch records where each node came from in `node.meta["from_node"]`: a list of
`torch.fx.traceback.NodeSource`, each holding the sources of *its* node, back to the exported
model. Every pass that re-traces a graph (ExecuTorch's ExportPass, run_decompositions, each of
XNNPACK's ~15 passes per partition) builds a new NodeSource per node, and its constructor
`copy.deepcopy`s the node's whole history (torch 2.11 `fx/traceback.py`, `NodeSource.__init__`).
The history grows by one level per pass, so lowering pays nodes x passes x depth in deep copies:
for MiniLM 8a8w, ~25 % of `lower_program` under cProfile.

No one changes a NodeSource once it is built: torch, ExecuTorch and torchao only read them
(`get_greatest_ancestor_node_identifier` for debug handles, the serializers' `to_dict`); the
only writes are in `NodeSource._from_dict`, on a NodeSource being built. So within
`sharing_node_sources()` a deep copy of a NodeSource returns the NodeSource itself: each node
still gets its own `from_node` list, and the histories share their (immutable) nodes, as a
persistent tree would. The provenance a node reports is unchanged, and so is every byte of the
.pte (debug handles included). Measured on MiniLM 8a8w (XNNPACK, seq 128, quiet machine, two
runs each): `lower_program` 20.2-22.0 s -> 15.5-15.8 s, the same .pte sha256.

The switch is process-wide while any lowering runs (a class attribute), so another thread's deep
copies share NodeSources meanwhile too, and it is taken away when the last lowering ends. If
torch ever defines its own `NodeSource.__deepcopy__`, this leaves it alone.

Not used around PT2E quantization or the stages' `.module()` calls: there the histories are
shallow, and the MiniLM 8a8w quantize stage took 2.4 s either way. `programs.save_program` gives
a saved program's nodes renumbered copies of their provenance, so sharing never lets one save
change another program's history.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from torch.fx.traceback import NodeSource

from qnn_compile.scoped_patch import Replacement, ScopedPatch


def _share(self: NodeSource, memo: dict[int, Any]) -> NodeSource:
    return self


def _replacements() -> list[Replacement]:
    if "__deepcopy__" in vars(NodeSource):
        return []  # torch defines its own: left alone
    return [(NodeSource, "__deepcopy__", _share)]


_PATCH = ScopedPatch(_replacements)


def sharing_node_sources() -> AbstractContextManager[None]:
    """While inside, `copy.deepcopy` shares NodeSource objects instead of copying them."""
    return _PATCH.active()

"""Shared provenance while lowering: same provenance, same .pte, and nothing outside sees it."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch.fx.traceback import NodeSource

from qnn_common.config import CompileConfig
from qnn_common.recipes import Backend, Recipe
from qnn_compile.backends import lowering_for
from qnn_compile.lower import lower_program
from qnn_compile.node_sources import sharing_node_sources


def _quantized_program() -> torch.export.ExportedProgram:
    """A PT2E 8a8w program: its nodes carry the export's and quantization's provenance."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(8 * 8 * 8, 4),
    ).eval()
    example = (torch.randn(1, 3, 8, 8),)
    captured = torch.export.export(model, example, strict=False).module()
    prepared = prepare_pt2e(
        captured, XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    )
    for _ in range(4):
        prepared(torch.randn(1, 3, 8, 8))
    return torch.export.export(convert_pt2e(prepared), example, strict=False)


def _histories(
    programs: list[torch.export.ExportedProgram],
) -> tuple[list[list[str]], int, int]:
    """Every node's provenance, flattened depth first (name, pass, graph in order of first
    appearance: ids are memory addresses), with how many NodeSource references and how many
    distinct NodeSource objects there are."""
    graphs: dict[int, int] = {}
    seen: set[int] = set()
    refs = 0

    def walk(sources: list[NodeSource], out: list[str]) -> None:
        nonlocal refs
        for s in sources:
            refs += 1
            seen.add(id(s))
            out.append(f"{s.name}/{s.pass_name}/{graphs.setdefault(s.graph_id, len(graphs))}")
            walk(s.from_node, out)

    histories = []
    for node in (n for program in programs for n in program.graph.nodes):
        history: list[str] = []
        walk(node.meta.get("from_node") or [], history)
        histories.append(history)
    return histories, refs, len(seen)


def test_a_deep_copy_shares_node_sources_only_inside() -> None:
    source = NodeSource(None, "a_pass")
    history = [source]
    with sharing_node_sources():
        with sharing_node_sources():  # nested: still on after the inner one ends
            pass
        shared = copy.deepcopy(history)
        assert shared is not history and shared[0] is source
    copied = copy.deepcopy(history)
    assert copied[0] is not source and copied[0].pass_name == "a_pass"
    assert "__deepcopy__" not in vars(NodeSource)


def test_the_switch_is_taken_away_after_an_error() -> None:
    with pytest.raises(RuntimeError), sharing_node_sources():
        raise RuntimeError("a lowering failed")
    assert "__deepcopy__" not in vars(NodeSource)


@pytest.mark.parametrize("backend", [Backend.XNNPACK, Backend.PORTABLE])
def test_lowering_gives_the_same_pte(backend: Backend) -> None:
    """The real lowering with torch's own deep copies and with sharing: the same bytes, debug
    handles included."""
    lowering = lowering_for(CompileConfig(backend=backend, recipe=Recipe.A8W8))
    stock = lower_program(_quantized_program(), lowering, share_provenance=False).pte
    assert lower_program(_quantized_program(), lowering).pte == stock


def test_every_node_keeps_its_provenance() -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    def edge(share: bool) -> list[torch.export.ExportedProgram]:
        """The top-level edge program and the one inside each XNNPACK delegate."""
        with sharing_node_sources() if share else contextlib.nullcontext():
            lowered = to_edge_transform_and_lower(
                _quantized_program(), partitioner=[XnnpackPartitioner()]
            )
        top = lowered.exported_program()
        inner = [m.original_module for m in top.graph_module.children()
                 if hasattr(m, "original_module")]
        assert inner, "nothing was delegated"
        return [top, *inner]

    stock, stock_refs, stock_objects = _histories(edge(False))
    shared, shared_refs, shared_objects = _histories(edge(True))
    assert shared == stock and any(shared)
    assert shared_refs == stock_refs
    assert shared_objects < stock_objects  # the histories share their nodes now

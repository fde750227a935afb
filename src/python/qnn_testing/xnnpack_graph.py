"""What the XNNPACK delegates of a .pte hold: their nodes, read back from the serialized graphs.

The compile report counts ops handed to a delegate, which says nothing about the precision the
delegate runs them at: a linear XNNPACK took as fp32 and one it took as int8 x int4 count alike.
This reads each XNNPACK payload of the program (an `XNNHeader` and a flatbuffer of the
`XNNGraph` schema that ships with ExecuTorch) and converts it to JSON with ExecuTorch's own
`flatc`, so a test can say "prefill holds 15 fully connected nodes with dynamically quantized
int8 inputs and blockwise 4-bit weights" about the bytes the runtime will execute.
"""

from __future__ import annotations

import collections
import importlib.resources
import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

XNNPACK_BACKEND = "XnnpackBackend"
# Fully connected nodes name their operands by value id; these fields hold the input and weight.
_FC = "XNNFullyConnected"


def _graph_json(payload: bytes) -> dict[str, Any]:
    """One XNNPACK delegate payload as the JSON of its XNNGraph flatbuffer."""
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader
    from executorch.exir._serialize._flatbuffer import _get_flatc_path

    header = XNNHeader.from_bytes(payload[: XNNHeader.EXPECTED_LENGTH])
    flatbuffer = payload[header.flatbuffer_offset : header.flatbuffer_offset
                         + header.flatbuffer_size]
    schema = importlib.resources.files("executorch.backends.xnnpack.serialization").joinpath(
        "schema.fbs"
    )
    with tempfile.TemporaryDirectory() as tmp, importlib.resources.as_file(schema) as fbs:
        binary = Path(tmp) / "graph.bin"
        binary.write_bytes(flatbuffer)
        subprocess.run(
            [_get_flatc_path(), "--json", "--strict-json", "--raw-binary", "-o", tmp,
             str(fbs), "--", str(binary)],
            check=True, capture_output=True,
        )
        text = (Path(tmp) / "graph.json").read_text("utf-8")
    # flatc writes unbounded clamps (a float add's output_min / output_max) as bare inf / nan,
    # which JSON lacks; Python's reader takes them as Infinity / NaN.
    text = re.sub(r"(?<=[:\[,\s])(-?)inf\b", r"\1Infinity", text)
    data: dict[str, Any] = json.loads(re.sub(r"(?<=[:\[,\s])-?nan\b", "NaN", text))
    return data


def _datatypes(graph: dict[str, Any]) -> dict[int, str]:
    """Value id -> XNNPACK datatype (``xnn_datatype_qbint4`` ...) of every tensor value."""
    out: dict[int, str] = {}
    for value in graph.get("xvalues", []):
        union = value.get("xvalue_union", {})
        tensor = union.get("tensor_value", union)
        out[int(tensor.get("id_out", 0))] = str(tensor.get("datatype"))
    return out


def node_census(pte: bytes) -> dict[str, collections.Counter[str]]:
    """Per method, the XNNPACK nodes of all its delegates by type; a fully connected node is
    spelled with its input and weight datatypes, e.g.
    ``XNNFullyConnected[xnn_datatype_qdint8,xnn_datatype_qbint4]`` (8da4w's linears)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte).program
    census: dict[str, collections.Counter[str]] = {}
    for plan in program.execution_plan:
        counts: collections.Counter[str] = collections.Counter()
        for delegate in plan.delegates:
            if delegate.id != XNNPACK_BACKEND:
                continue
            if delegate.processed.location.name != "INLINE":
                raise ValueError(
                    "an XNNPACK payload stored as a segment: read it with "
                    "executorch.exir._serialize._program.deserialize_pte_binary's segments"
                )
            graph = _graph_json(program.backend_delegate_data[delegate.processed.index].data)
            types = _datatypes(graph)
            for node in graph.get("xnodes", []):
                kind = str(node["xnode_union_type"])
                if kind == _FC:
                    fields = node["xnode_union"]
                    kind += (f"[{types.get(int(fields.get('input1_id', 0)))},"
                             f"{types.get(int(fields.get('filter_id', 0)))}]")
                counts[kind] += 1
        census[plan.name] = counts
    return census


def cpu_operators(pte: bytes) -> dict[str, collections.Counter[str]]:
    """Per method, the operators the program calls outside its delegates (the CPU kernels), by
    kernel name with overload, e.g. ``quantized_decomposed::embedding_byte.out``, each counted
    once per call site."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte).program
    out: dict[str, collections.Counter[str]] = {}
    for plan in program.execution_plan:
        names = [f"{op.name}.{op.overload}" if op.overload else op.name for op in plan.operators]
        counts: collections.Counter[str] = collections.Counter()
        for chain in plan.chains:
            for instruction in chain.instructions:
                index = getattr(instruction.instr_args, "op_index", None)
                if index is not None:
                    counts[names[index]] += 1
        out[plan.name] = counts
    return out


# 8da4w's linear as XNNPACK runs it: int8 activations quantized per token at run time
# (qdint8), 4-bit weights with one scale per block of input channels (qbint4).
DYNAMIC_INT8_X_BLOCKWISE_INT4 = f"{_FC}[xnn_datatype_qdint8,xnn_datatype_qbint4]"
# 8da4w's linears with int8 weights (by default a causal LM's output head): int8 activations
# per token, int8 weights with one scale per output channel (qcint8).
DYNAMIC_INT8_X_CHANNEL_INT8 = f"{_FC}[xnn_datatype_qdint8,xnn_datatype_qcint8]"
# A float linear: the asymmetric groups' offsets (qnn_quant.intx), two per 4-bit linear.
FLOAT_FC = f"{_FC}[xnn_datatype_fp32,xnn_datatype_fp32]"

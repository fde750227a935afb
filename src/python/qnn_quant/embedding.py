"""8da4w's embedding tables: int8 or 4-bit groups, looked up without a float copy.

8da4w quantizes linear layers. A causal LM's token embedding is the largest table left float
(SmolLM2-135M: 49,152 x 576 float32, 113 MB of a 229 MB program). Upstream's LLM exports pair
8da4w with a weight-only embedding (`export_llm --qembedding 8w|4w`, optimum-executorch
`--qembedding`): torchao's `IntxWeightOnlyConfig` on each `nn.Embedding`, which exports as
``torchao.dequantize_affine`` feeding ``aten.embedding``; ExecuTorch's quant fusion
(`ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True)`, set by `qnn_compile.lower`
when a program has such a lookup) turns the pair into ``quantized_decomposed.embedding_byte`` /
``embedding_4bit``, kernels that dequantize only the rows a call reads. The same is done here,
on the exported graph, the way `qnn_quant.intx` does linears: each ``aten.embedding`` with a
constant table gets a quantized table and calls ``F.embedding`` (the quantized tensor implements
it; the exported graph then holds the int values, scales and zero points as plain tensors).

A table tied to the output head (SmolLM2's) is shared in the float program. The head has its own
quantized weight by then (`qnn_quant.intx`: int8 per output channel by default), so the lookup
gets a quantized table under the embedding's own name and the float table, read by nobody,
leaves the program.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from qnn_common.weight_groups import EmbeddingWeights
from qnn_quant.graph_params import INT4, give_quantized_weight, owner
from qnn_quant.layers import module_path


@dataclass(frozen=True)
class EmbeddingForm:
    """How one embedding table was stored: its weights' bits and how many share a scale."""

    weights: EmbeddingWeights
    group_size: int  # 0: one scale per row

    def describe(self) -> str:
        if self.weights is EmbeddingWeights.FLOAT:
            return "float"
        per = "per row" if self.group_size == 0 else f"per {self.group_size} channels"
        kind = "symmetric" if self.weights is EmbeddingWeights.INT8 else "asymmetric"
        return f"{self.weights.value} ({kind}, one scale {per})"


def embedding_form(weights: EmbeddingWeights, group_size: int) -> EmbeddingForm:
    """Groups of `group_size` (8da4w's) channels of each row: 8w int8 and symmetric, 4w 4-bit
    and asymmetric (GGUF Q4_1's form). A group's scale is 1/group_size of its int8 values' bytes
    in float; one scale per row instead cost SmolLM2's table 38.6 dB where groups of 32 keep it
    exactly (its values sit on a Q4_1 grid of 32-channel groups)."""
    return EmbeddingForm(weights, group_size)


def _config(form: EmbeddingForm) -> Any:
    from torchao.quantization import IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_primitives import MappingType

    if form.weights is EmbeddingWeights.INT8:
        return IntxWeightOnlyConfig(
            weight_dtype=torch.int8,
            granularity=PerGroup(form.group_size) if form.group_size else PerAxis(0),
            mapping_type=MappingType.SYMMETRIC,
        )
    return IntxWeightOnlyConfig(
        weight_dtype=INT4, granularity=PerGroup(form.group_size),
        mapping_type=MappingType.ASYMMETRIC,
    )


def _quantized_table(weight: torch.Tensor, form: EmbeddingForm) -> nn.Parameter:
    from torchao.quantization import quantize_

    holder = nn.Embedding(weight.shape[0], weight.shape[1], device="meta")
    holder.weight = nn.Parameter(weight.detach(), requires_grad=False)
    with torch.no_grad():
        quantize_(holder, _config(form), filter_fn=lambda m, _: isinstance(m, nn.Embedding))
    return holder.weight


def _table(node: torch.fx.Node) -> torch.fx.Node | None:
    """The constant table (a get_attr node) of an ``aten.embedding`` node, or None."""
    if node.op != "call_function" or node.target is not torch.ops.aten.embedding.default:
        return None
    table = node.args[0]
    if not isinstance(table, torch.fx.Node) or table.op != "get_attr":
        return None
    return table


def quantize_embeddings(
    gm: torch.fx.GraphModule, form: EmbeddingForm
) -> dict[str, str]:
    """Give every ``aten.embedding`` of `gm` with a constant 2-D table a quantized table in
    `form`, in place (module docstring). Returns {module path: what was done} for each lookup,
    "kept float: why" for those left alone. The caller re-exports `gm`."""
    done: dict[str, str] = {}
    if form.weights is EmbeddingWeights.FLOAT:
        return done
    tables: list[torch.Tensor] = []  # the float tables replaced
    for node in list(gm.graph.nodes):
        table_node = _table(node)
        if table_node is None:
            continue
        path = module_path(node) or node.name
        table = operator.attrgetter(str(table_node.target))(gm)
        if table.dim() != 2 or not table.dtype.is_floating_point:
            done[path] = f"kept float: a {table.dim()}-D {table.dtype} table"
            continue
        if form.group_size and table.shape[1] % form.group_size:
            done[path] = (
                f"kept float: row size {table.shape[1]} is not a multiple of group_size "
                f"{form.group_size}"
            )
            continue
        quantized = _quantized_table(table, form)
        tables.append(table)
        new_table = give_quantized_weight(gm, node, table_node, quantized, module_path(node))
        # The quantized tensor implements F.embedding (torch function level), as it does
        # F.linear; aten.embedding's arguments are (table, indices), F.embedding's the reverse.
        node.target = torch.nn.functional.embedding
        node.args = (node.args[1], new_table)
        done[path] = form.describe()
    gm.graph.eliminate_dead_code()
    _drop_unread(gm, tables)
    gm.recompile()
    return done


def _drop_unread(gm: torch.fx.GraphModule, tables: list[torch.Tensor]) -> None:
    """Delete every name of a float table in `tables` that no node reads any more. A tied table
    has several (export's module reads `lm_head.weight` for both uses and keeps
    `embed_tokens.weight` beside it); once the head and the lookup have quantized weights,
    any name left on the module would be exported as a parameter, and the program would carry
    the float table after all."""
    read = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    storages = {t.untyped_storage().data_ptr() for t in tables}
    for name, tensor in list(gm.named_parameters(remove_duplicate=False)) + list(
        gm.named_buffers(remove_duplicate=False)
    ):
        if name in read or "parametrizations." in name:
            continue
        if tensor.untyped_storage().data_ptr() in storages:
            holder, leaf = owner(gm, name)
            holder._parameters.pop(leaf, None)
            holder._buffers.pop(leaf, None)

"""The linear layers of a causal LM, grouped as the recipe search moves them: each group a
decoder block's attention projections, its MLP's, or a layer of its own (the head), named by the
module-path pattern a per-layer recipe table (`quantize.layer_recipes`) takes."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from qnn_quant.fused_qdq import module_tensor
from qnn_quant.layers import module_path

_LINEAR = torch.ops.aten.linear.default


@dataclass(frozen=True)
class LayerGroup:
    """Linear layers whose module paths share a parent (`name`); `pattern` matches exactly
    them; `weights` is their weights' element count."""

    name: str
    pattern: str
    paths: tuple[str, ...]
    weights: int

    def weight_bytes(self, bits: int) -> int:
        return self.weights * bits // 8


def linear_weights(gm: torch.fx.GraphModule) -> dict[str, str]:
    """Module path -> the attribute holding its weight, for every linear of `gm` whose weight is
    one constant (a float module's parameter, a fake-quant module's folded weight)."""
    found: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not _LINEAR:
            continue
        path, weight = module_path(node), node.args[1]
        if path is not None and isinstance(weight, torch.fx.Node) and weight.op == "get_attr":
            found.setdefault(path, str(weight.target))
    return found


def layer_groups(gm: torch.fx.GraphModule) -> list[LayerGroup]:
    """The groups of `gm`'s linears, in graph order: the layers under one parent module (a
    block's `self_attn`, its `mlp`) together, a layer directly under the model (the head) alone."""
    by_parent: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    for path, target in linear_weights(gm).items():
        parent = path.rpartition(".")[0]
        key = parent if re.search(r"\.\d+\.", parent + ".") else path
        by_parent.setdefault(key, []).append(path)
        sizes[key] = sizes.get(key, 0) + module_tensor(gm, target).numel()
    groups = []
    for key, paths in by_parent.items():
        # A lone layer by its own path; a parent's layers as its direct children.
        pattern = re.escape(key) + ("$" if paths == [key] else r"\.[^.]+$")
        groups.append(LayerGroup(_short(key), pattern, tuple(paths), sizes[key]))
    return groups


def _short(path: str) -> str:
    """A group's name as people say it: ``layers.3.mlp`` for ``hf.model.layers.3.mlp``."""
    match = re.search(r"(?:^|\.)((?:layers|h|blocks|block|layer)\.\d+\..*)$", path)
    return match.group(1) if match else path.rpartition(".")[2] or path


def swap_weights(
    targets: Sequence[torch.nn.Module], sources: Sequence[Mapping[str, torch.Tensor]],
    group: LayerGroup,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copy `group`'s weights from `sources` (per method: module path -> weight) into the same
    layers of `targets` (the methods' modules), in place; returns (tensor, its old value) pairs
    for `restore`."""
    saved = []
    for module, source in zip(targets, sources, strict=True):
        assert isinstance(module, torch.fx.GraphModule)
        attrs = linear_weights(module)
        for path in group.paths:
            if path not in attrs or path not in source:
                continue
            tensor = module_tensor(module, attrs[path])
            saved.append((tensor, tensor.detach().clone()))
            with torch.no_grad():
                tensor.copy_(source[path].to(tensor.dtype))
    return saved


def restore(saved: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for tensor, value in saved:
            tensor.copy_(value)

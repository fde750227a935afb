"""Constants added to an exported graph's module: new parameters, and torchao-quantized weights
held as their plain inner tensors. Shared by the weight transforms (`qnn_quant.intx` for
linears, `qnn_quant.embedding` for lookup tables)."""

from __future__ import annotations

import operator

import torch
from torch import nn


def owner(gm: torch.fx.GraphModule, dotted: str) -> tuple[nn.Module, str]:
    """The module that holds attribute `dotted` of `gm` (empty parent modules created as
    needed), and the attribute's own name."""
    *parents, name = dotted.split(".")
    holder: nn.Module = gm
    for part in parents:
        child = getattr(holder, part, None)
        if not isinstance(child, nn.Module):
            child = nn.Module()
            holder.add_module(part, child)
        holder = child
    return holder, name


def add_param(gm: torch.fx.GraphModule, wanted: str, value: torch.Tensor) -> str:
    """Register `value` as a frozen parameter under a free name near `wanted`; its name."""
    name = free_name(gm, wanted)
    holder, leaf = owner(gm, name)
    holder.register_parameter(leaf, nn.Parameter(value, requires_grad=False))
    return name


def set_weight(gm: torch.fx.GraphModule, dotted: str, value: nn.Parameter) -> None:
    """Register the quantized weight `value` as `dotted` on `gm` (empty parent modules created
    as needed), stored as its plain inner tensors.

    A tensor subclass cannot be a program's state: it does not serialize, and its storage is
    not data. torchao's `UnwrapTensorSubclass` parametrization (what its `unwrap_tensor_subclass`
    puts on nn.Linear modules, as upstream's exports do) keeps the int8 values, scales and zero
    points as plain tensors and rebuilds the subclass on every read, so export traces the
    rebuild and the program holds the plain tensors.
    """
    from torch.nn.utils import parametrize
    from torchao.utils import UnwrapTensorSubclass

    holder, name = owner(gm, dotted)
    if name in holder._parameters:
        del holder._parameters[name]
    elif hasattr(holder, name):
        delattr(holder, name)
    holder.register_parameter(name, value)
    parametrize.register_parametrization(holder, name, UnwrapTensorSubclass())


def free_name(gm: torch.fx.GraphModule, wanted: str) -> str:
    """`wanted`, or `wanted` with a numbered suffix, whichever names nothing on `gm` yet."""
    name, i = wanted, 0
    while True:
        try:
            operator.attrgetter(name)(gm)
        except AttributeError:
            return name
        i += 1
        name = f"{wanted}_{i}"

"""Constants added to an exported graph's module: new parameters, and torchao-quantized weights
held as their plain inner tensors. Shared by the weight transforms (`qnn_quant.intx` for
linears, `qnn_quant.embedding` for lookup tables)."""

from __future__ import annotations

import operator
import warnings

import torch
from torch import nn

# The 4-bit weight dtype: real since torch 2.3 (the sub-byte ints), missing from torch's type
# stubs: silenced once here rather than at every use.
INT4: torch.dtype = torch.int4  # type: ignore[attr-defined]


def owner(gm: nn.Module, dotted: str) -> tuple[nn.Module, str]:
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


def give_fake_values(
    gm: torch.fx.GraphModule, like: torch.fx.Node, nodes: list[torch.fx.Node]
) -> None:
    """Give `nodes` (new, in graph order) `like`'s metadata (its module path, so `keep_float`
    patterns still match) and the fake value each computes: quantizers read both. `like`'s
    first argument carries the export's fake mode."""
    from torch._guards import detect_fake_mode

    x = like.args[0]
    assert isinstance(x, torch.fx.Node)
    fake_mode = detect_fake_mode([x.meta["val"]])
    assert fake_mode is not None  # export metadata holds fake tensors
    for node in nodes:
        if node.op == "get_attr":
            holder, leaf = owner(gm, str(node.target))
            val = fake_mode.from_tensor(getattr(holder, leaf))
        else:
            assert callable(node.target)
            args = torch.fx.node.map_arg(node.args, lambda n: n.meta["val"])
            with fake_mode:
                val = node.target(*args)
        node.meta = {**like.meta, "val": val}


def add_param(gm: torch.fx.GraphModule, wanted: str, value: torch.Tensor) -> str:
    """Register `value` as a frozen parameter under a free name near `wanted`; its name."""
    name = free_name(gm, wanted)
    holder, leaf = owner(gm, name)
    holder.register_parameter(leaf, nn.Parameter(value, requires_grad=False))
    return name


def replace_tensor(module: nn.Module, dotted: str, value: torch.Tensor) -> None:
    """Make attribute `dotted` of `module` a new tensor `value` (a frozen parameter or a buffer,
    as it was), instead of writing into the old one's storage: a graph module from
    `ExportedProgram.module()` shares its tensors with the program, and those are the caller's
    (its float weights, or an eager model's)."""
    holder, name = owner(module, dotted)
    if name in holder._buffers:
        holder._buffers[name] = value
        return
    if name in holder._parameters:
        del holder._parameters[name]
    elif hasattr(holder, name):
        delattr(holder, name)
    holder.register_parameter(name, nn.Parameter(value, requires_grad=False))


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


def give_quantized_weight(
    gm: torch.fx.GraphModule, node: torch.fx.Node, weight_node: torch.fx.Node,
    value: nn.Parameter, path: str | None,
) -> torch.fx.Node:
    """Register `value` (a quantized weight) for `node`, which reads the constant `weight_node`,
    and return the get_attr node `node` must read it through.

    Read by `node` alone, the constant is replaced under its own name. Read by others too (a
    tied embedding and output head), it stays float for them, and `value` goes under a free
    name near `path`'s weight (`node`'s name when it has no module path).
    """
    shared = any(u is not node for u in weight_node.users) or any(
        n is not weight_node and n.op == "get_attr" and n.target == weight_node.target
        for n in gm.graph.nodes
    )
    if not shared:
        set_weight(gm, str(weight_node.target), value)
        return weight_node
    name = free_name(gm, f"{path}.weight" if path else f"{node.name}_weight")
    set_weight(gm, name, value)  # before the get_attr that names it
    # fx looks for a parameter, buffer or module of that name and warns that none exists: the
    # weight is the parametrization's property, which does resolve.
    with gm.graph.inserting_before(node), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Attempted to insert a get_attr Node")
        return gm.graph.get_attr(name)

"""A causal LM's methods as modules run in Python the way the .pte runs them: the reference the
quantize stage reports on, calibrates with and the evaluation scores (`ExportedProgram.module()`,
a fake-quantized or a prepared graph alike)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import torch
from torch.export import ExportedProgram

from qnn_common.causal_lm.steps import MethodRunner
from qnn_common.cli.noise import native_noise_filtered
from qnn_common.llm_spec import DECODE, PREFILL, LlmSpec
from qnn_common.torchio.known_weights import buffers_written

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


def module_runner(modules: Mapping[str, torch.nn.Module], spec: LlmSpec) -> MethodRunner:
    """Run the methods' modules the way the .pte runs them: a KV-as-IO program positionally, a
    static-cache one by keyword. Build the modules with `lm_modules` (or share their cache with
    `share_state`): otherwise decode reads a cache prefill never wrote."""

    def run(method: str, inputs: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        module = modules[method]
        with torch.no_grad(), native_noise_filtered():
            if spec.kv_layout is None:
                return [module(input_ids=inputs[0], cache_position=inputs[1])]
            return list(module(*inputs))

    return run


def written_buffers(programs: Mapping[str, ExportedProgram]) -> set[str]:
    """The buffers any of the methods writes (its KV cache, when the cache is inside)."""
    return {fqn for program in programs.values() for fqn in buffers_written(program)}


def lm_modules(
    programs: Mapping[str, ExportedProgram], make: Callable[[ExportedProgram], ModuleT],
) -> dict[str, ModuleT]:
    """Each method's module as `make` builds it (`ExportedProgram.module`: the float one),
    decode's cache made prefill's, and that cache the modules' own: `ExportedProgram.module()`
    shares the program's tensors, and a run through it would leave its cache and counters in
    the program, which the compile then serializes as the program's initial state."""
    modules = {method: make(program) for method, program in programs.items()}
    written = written_buffers(programs)
    for module in modules.values():
        own_copies(module, written)
    share_state(modules, written)
    return modules


def own_copies(module: torch.nn.Module, names: set[str]) -> None:
    """Give `module` its own copy of each buffer of `names` it has."""
    for fqn, tensor in list(module.named_buffers()):
        if fqn in names:
            owner, _, leaf = fqn.rpartition(".")
            holder = module.get_submodule(owner) if owner else module
            holder.register_buffer(leaf, tensor.clone(), persistent=leaf not in
                                   holder._non_persistent_buffers_set)


def share_state(modules: Mapping[str, torch.nn.Module], written: set[str]) -> int:
    """Make decode's written buffers (its KV cache) prefill's very tensors, as the .pte shares
    them (`share_mutable_buffers`): each method's module, made apart, holds its own copy, and a
    decode step would read an empty cache after prefill wrote the prompt into its own. Returns
    how many buffers are shared (none for a program whose cache is its inputs and outputs)."""
    if PREFILL not in modules or DECODE not in modules:
        return 0
    source, dest = modules[PREFILL], modules[DECODE]
    theirs = dict(source.named_buffers())
    shared = 0
    for fqn, mine in list(dest.named_buffers()):
        other = theirs.get(fqn)
        if fqn not in written or other is None or other.shape != mine.shape:
            continue
        owner, _, leaf = fqn.rpartition(".")
        holder = dest.get_submodule(owner) if owner else dest
        holder.register_buffer(leaf, other, persistent=False)
        shared += 1
    return shared

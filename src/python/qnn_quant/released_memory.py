"""What PT2E leaves behind after a conversion, let go: the modules it memoized and the float
weights nothing reads any more. Each costs a quantize stage its model's weights once more. And
the memory freed, handed back to the system rather than kept by the allocator.

A full collection walks every object the process holds, whatever it frees: in a process that
builds many programs (the op suite, a sweep, a recipe search) the two per quantization took
about a fifth of the time, for models whose weights are a few kB. So they run only when what they
free is worth a walk (`WORTH_COLLECTING` bytes of weights); below that the collector's own
passes take it.
"""

from __future__ import annotations

import ctypes
import functools
import gc
from collections.abc import Iterable
from typing import Any

import torch
from torch.export import ExportedProgram

# Weights that a full collection is run to free at once (smaller ones wait for the collector's
# next pass): about a 16M-parameter fp32 model.
WORTH_COLLECTING = 64 * 2**20


def weight_bytes(programs: Iterable[ExportedProgram]) -> int:
    """The bytes of the parameters, buffers and constants `programs` hold (a tensor shared
    between them counted once)."""
    seen: set[int] = set()
    total = 0
    for ep in programs:
        for tensor in (*ep.state_dict.values(), *ep.constants.values()):
            if isinstance(tensor, torch.Tensor) and id(tensor) not in seen:
                seen.add(id(tensor))
                total += tensor.nbytes
    return total


def collect_if_worth_it(freed_bytes: int) -> bool:
    """Run a full collection (and hand the freed heap back) when `freed_bytes` of weights wait
    on it; True if it ran."""
    if freed_bytes < WORTH_COLLECTING:
        return False
    gc.collect()
    return_freed_heap()
    return True


def forget_prepared_modules(freed_bytes: int) -> None:
    """Let the modules PT2E prepared and converted go.

    Its device lookup is memoized on the module (`functools.cache` on torch.ao's
    `assert_and_get_unique_device` and torchao's `_assert_and_get_unique_device`), so every
    module it prepared stayed alive for the rest of the process, holding the float model it was
    prepared from (a submodule tree with every float weight) and its observers: a causal LM's
    quantize stage held its fp32 weights twice over through the reference run and the save.
    Clearing costs one lookup per module next time; the collection returns the freed memory
    (`freed_bytes`: the weights the prepared modules held) now rather than at the collector's
    next full pass, where that is worth a walk of the heap.
    """
    import torchao.utils
    from torch.ao.quantization.fx import utils as fx_utils

    for lookup in (fx_utils.assert_and_get_unique_device,
                   torchao.utils._assert_and_get_unique_device):
        lookup.cache_clear()
    collect_if_worth_it(freed_bytes)


def return_freed_heap() -> bool:
    """Hand the allocator's free heap pages back to the system (glibc's `malloc_trim`); False
    where the C library has none.

    A tensor smaller than glibc's mmap threshold lives on the heap, and the threshold rises to
    the largest mapping freed so far (up to 32 MB), so after a model's first weights come and go
    most tensors do. Freed heap pages stay in the process: once GPTQ has dropped its Hessians and
    the weights it replaced, a causal LM's quantize stage kept that memory through convert, the
    reference run and the save, as if nothing had been freed.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim() -> Any:
    # The process's own symbols: glibc's on Linux, none by that name elsewhere.
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


def drop_unused_tensors(gm: torch.fx.GraphModule) -> int:
    """Delete the parameters and buffers no node of `gm` reads; returns how many.

    convert_pt2e folds each quantized weight into a new int8 constant but leaves the float
    original on the module, and export lifts every parameter, read or not: MiniLM 8a8w's
    program carried 28 MB of float weights nothing used (99 MB on disk), saved, loaded and
    hashed by every later stage.
    """
    used = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    names = [name for name, _ in gm.named_parameters(remove_duplicate=False)]
    names += [name for name, _ in gm.named_buffers(remove_duplicate=False)]
    dropped = 0
    for name in names:
        if name in used:
            continue
        owner_path, _, attr = name.rpartition(".")
        owner = gm.get_submodule(owner_path) if owner_path else gm
        if hasattr(owner, attr):
            delattr(owner, attr)
            dropped += 1
    return dropped

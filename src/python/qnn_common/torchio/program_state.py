"""The state a program keeps between calls: the buffers it updates in place.

`ExportedProgram.module()` shares its buffers with the program, so running that module (to
calibrate, or to compute a reference) on a model that writes a buffer (a static KV cache, a
running statistic) changes the program itself: saved or lowered afterwards, it would start from
the last sample's state instead of the model's registered one. Every stage that runs a program
it will hand on does so inside `initial_buffers_kept`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.export import ExportedProgram


def buffers(ep: ExportedProgram) -> dict[str, torch.Tensor]:
    """Every buffer of `ep` (persistent or not), by fully qualified name, as `ep` holds them.

    All of them, not only `graph_signature.buffers_to_mutate`: an exported program keeps a write
    through a view (`cache[2:4] = rows`) or an in-place op as such, and the signature names the
    buffers it mutates only once the program is functionalized (at edge conversion).
    """
    names = set(ep.graph_signature.inputs_to_buffers.values())
    names |= set(ep.graph_signature.buffers_to_mutate.values())
    held = {**ep.constants, **ep.state_dict}
    return {
        fqn: held[fqn] for fqn in sorted(names) if isinstance(held.get(fqn), torch.Tensor)
    }


@contextlib.contextmanager
def initial_buffers_kept(*holders: ExportedProgram | torch.nn.Module) -> Iterator[None]:
    """Put the buffers of `holders` (programs, or modules: an eager model shares its buffers
    with the program exported from it) back to their values on entry, on exit (also on error)."""
    held = [
        t for h in holders
        for t in (buffers(h).values() if isinstance(h, ExportedProgram) else h.buffers())
    ]
    saved = [(tensor, tensor.detach().clone()) for tensor in held]
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, value in saved:
                tensor.copy_(value)

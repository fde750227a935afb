"""One set of scales for a program's methods: a causal LM's prefill and decode.

Both methods are prepared with the same quantizer and calibrated together (text through prefill
in chunks, a short tail through decode: `calibration.causal_lm_calibration`); then every
observer of decode takes the statistics of its counterpart in prefill: the two graphs hold the
same ops in the same order, and prefill has seen every position decode will see. The methods
then quantize with identical scales and zero points, so they agree on every shared tensor (the
KV cache written by one and read by the other) and their quantized weights are the same bytes,
which the .pte stores once (`static.quantize_static`).
"""

from __future__ import annotations

import collections
from typing import Any

import torch

from qnn_common.errors import StageError
from qnn_quant.layers import module_path

_STAGE = "quantize"


def _observers(gm: torch.fx.GraphModule) -> dict[tuple[str, ...], tuple[str, Any]]:
    """Observers keyed by what they observe, the same way in every method: a graph input by
    name, an op by (module path, target, how many such ops came before it), and an observer of
    a node by its source's key plus a marker and how many observers of that source came before
    it. The count matters where one tensor has several observers: a tied embedding / LM-head
    weight feeds the embedding (per-tensor) and the LM head (per-channel), and without it the
    two shared one key, so one of them was never copied."""
    keys: dict[torch.fx.Node, tuple[str, ...]] = {}
    out: dict[tuple[str, ...], tuple[str, Any]] = {}
    seen: collections.Counter[tuple[str, ...]] = collections.Counter()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            keys[node] = ("input", node.name)
        elif node.op == "call_function":
            what = (module_path(node) or "", str(node.target))
            keys[node] = (*what, str(seen[what]))
            seen[what] += 1
        elif node.op == "call_module":
            source = node.args[0] if node.args else None
            base = (*keys.get(source, ("?", str(source))), "observer") if isinstance(
                source, torch.fx.Node) else ("?", node.name)
            key = (*base, str(seen[base]))
            seen[base] += 1
            keys[node] = key
            observer = gm.get_submodule(str(node.target))
            if hasattr(observer, "calculate_qparams"):
                out[key] = (str(node.target), observer)
    return out


_FIRST_FORWARD_ATTRS = ("original_dtype", "min_val", "max_val")


def share_observers(source: torch.fx.GraphModule, dest: torch.fx.GraphModule) -> int:
    """Copy every observer's statistics from `source` (prefill) to its counterpart in `dest`.

    Observers match by the op they observe: its module path, its target and how many such ops
    came before it (and, for a tensor observed more than once, which of its observers). The
    methods may differ by a few layout ops (a `contiguous` that is a no-op for one token); every
    observer of `dest` must have a counterpart of the same type and end up with statistics, or
    this refuses. Returns the number copied.
    """
    src, dst = _observers(source), _observers(dest)
    for key, (name, observer) in dst.items():
        match = src.get(key)
        if match is None or type(match[1]) is not type(observer):
            raise StageError(
                _STAGE,
                f"observer {name} ({type(observer).__name__} of {'/'.join(key)}) has no "
                "counterpart in prefill: the methods "
                "are not one program at two shapes, so they cannot share quantization scales",
            )
        observer.load_state_dict(match[1].state_dict())
        # ExecuTorch's per-block (LPBQ) observer keeps its range and its input's dtype as plain
        # attributes its first forward sets, outside the state dict: decode's never ran, and
        # convert refuses them without these.
        for attr in _FIRST_FORWARD_ATTRS:
            if getattr(observer, attr, None) is None and getattr(match[1], attr, None) is not None:
                setattr(observer, attr, getattr(match[1], attr))
    unobserved = [
        name for name, observer in dst.values()
        if not _has_observed(observer)
    ]
    if unobserved:
        # convert_pt2e would quantize these with its default qparams (scale 1): a weight at
        # scale 1 rounds to a handful of integers and the method's logits are noise.
        raise StageError(
            _STAGE,
            f"observers {unobserved[:5]} of decode have no statistics after sharing prefill's "
            f"({len(unobserved)} in all): calibration never reached the ops they observe",
        )
    return len(dst)


def _has_observed(observer: Any) -> bool:
    """Whether a min/max observer has seen data (an unrun one holds inf, or no channels)."""
    low = getattr(observer, "min_val", None)
    if not isinstance(low, torch.Tensor):
        return True  # not a min/max observer: nothing to tell
    return low.numel() > 0 and bool(torch.isfinite(low).all())

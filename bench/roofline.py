"""How far a program runs from this machine's limit: a roofline per program (issue 54).

A program cannot take less time per inference than the larger of two: reading its weights once
from memory at the host's bandwidth, and doing its multiply-accumulates (MACs) at the host's GEMM
throughput for its precision (int8 where the recipe's activations are 8-bit integers, as
XNNPACK's QS8 / QD8 kernels compute; fp32 otherwise). `fraction` = that bound / the measured
time: 1.0 runs at the machine's limit, 0.1 leaves nine tenths of the time to something else
(overheads, layout conversions, ops outside the delegate, a kernel short of the peak).

The peaks are measured here (`probe_host`), not read off a datasheet: the best of a few reads of
an array far larger than the caches, and of torch's own GEMMs (MKL for fp32, FBGEMM / oneDNN's
dynamically quantized linear for int8), at the thread count the program ran with. Those GEMMs
are good, not perfect: a kernel can beat them, so a fraction above 1.0 is possible and means the
probe's peak is low. Weights are counted, activations not (at these sizes they stay in cache); a
decode step also reads its KV cache, which `decode_cost` counts.
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from qnn_common.recipes import Recipe
from qnn_common.weight_groups import DEFAULT_GROUP_SIZE, DEFAULT_INT8_WEIGHTS

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Scales stored beside integer weights: per output channel (fp32), or per group of weights
# (bf16, as XNNPACK's blockwise 4-bit kernels keep them).
_CHANNEL_SCALE_BYTES = 4
_GROUP_SCALE_BYTES = 2


@dataclass(frozen=True)
class HostPeaks:
    """What this host does at best, at `threads` threads: GB/s read from memory (10^9 bytes),
    and 10^9 multiply-accumulates per second in fp32 and int8 GEMMs."""

    threads: int
    read_gb_s: float
    fp32_gmac_s: float
    int8_gmac_s: float | None  # None: torch has no int8 GEMM on this CPU

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _best_seconds(work: Callable[[], object], repeats: int) -> float:
    work()  # the first call pays for allocation and kernel selection
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - t)
    return best


def _read_seconds(mib: int, repeats: int) -> float:
    array = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    return _best_seconds(lambda: array.sum(), repeats)


def _int8_gemm_seconds(x: torch.Tensor, repeats: int) -> float | None:
    """A square int8 GEMM with activations quantized per call, as XNNPACK's qd8 kernels run:
    torch's dynamically quantized linear (FBGEMM / oneDNN; `torch._int_mm` has only a slow
    reference kernel on the CPU). None where this torch has no quantized engine for the CPU."""
    n = x.shape[0]
    try:
        with warnings.catch_warnings():  # the quantized modules are deprecated, not gone
            warnings.simplefilter("ignore")
            # Untyped in torch's stubs.
            linear = cast(Any, torch.ao.nn.quantized.dynamic).Linear(n, n, bias_=False)
            return _best_seconds(lambda: linear(x), repeats)
    # AttributeError: a torch without the deprecated quantized modules; RuntimeError /
    # NotImplementedError: no quantized engine or kernel for this CPU. The row then takes
    # the fp32 peak, which `roofline` says in its `peak` field.
    except (RuntimeError, AttributeError, NotImplementedError):
        return None


def probe_host(threads: int, read_mib: int = 512, gemm: int = 1024,
               repeats: int = 5) -> HostPeaks:
    """Measure the peaks at `threads` threads (torch's pool, restored after): a sum over a
    `read_mib` MiB fp32 array (memory read), and `gemm`-square fp32 and int8 matrix products."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        read_s = _read_seconds(read_mib, repeats)
        a, b = torch.randn(gemm, gemm), torch.randn(gemm, gemm)
        fp32_s = _best_seconds(lambda: torch.mm(a, b), repeats)
        int8_s = _int8_gemm_seconds(a, repeats)
    finally:
        torch.set_num_threads(before)
    macs = gemm**3 / 1e9
    return HostPeaks(threads, read_mib * 2**20 / read_s / 1e9, macs / fp32_s,
                     None if int8_s is None else macs / int8_s)


@dataclass(frozen=True)
class Cost:
    """What one inference (or one decode step) must do: MACs, and bytes of weights (and KV
    cache) read."""

    macs: int
    bytes_read: int


def _weight_bits(recipe: Recipe) -> int:
    traits = recipe.traits
    if traits.weight_bits is not None:
        return traits.weight_bits
    return 16 if recipe is Recipe.FP16 else 32


def _matmul_weight_bytes(weight: torch.Tensor, recipe: Recipe, group_size: int,
                         int8: bool = False) -> int:
    """A linear's or convolution's weight as the recipe stores it, with its scales; `int8`: one
    the recipe keeps at 8 bits per channel (`int8_weights`)."""
    if int8:
        return weight.numel() + weight.shape[0] * _CHANNEL_SCALE_BYTES
    bits = _weight_bits(recipe)
    data = weight.numel() * bits // 8
    if recipe.traits.weight_bits is None:
        return data
    if recipe.traits.weight_groups is not None:
        return data + weight.numel() // group_size * _GROUP_SCALE_BYTES
    return data + weight.shape[0] * _CHANNEL_SCALE_BYTES


def weights_read(module: nn.Module, recipe: Recipe, rows_looked_up: dict[str, int],
                 group_size: int = DEFAULT_GROUP_SIZE,
                 int8_weights: Sequence[str] = DEFAULT_INT8_WEIGHTS) -> int:
    """Bytes of weights one inference reads: every linear and convolution weight at the recipe's
    width (with its scales; a grouped 4-bit recipe keeps the linears `int8_weights` names at 8
    bits, as the quantize stage does by default: a causal LM's head), their biases and other
    parameters in fp32, and of each embedding table only the rows looked up (`rows_looked_up`,
    by module name)."""
    grouped = recipe.traits.weight_groups is not None
    total = 0
    for name, sub in module.named_modules():
        own = dict(sub.named_parameters(recurse=False))
        if isinstance(sub, nn.Embedding):
            rows = min(rows_looked_up.get(name, 0), sub.num_embeddings)
            total += rows * sub.embedding_dim * 4
            continue
        weight = own.pop("weight", None)
        if isinstance(sub, nn.Linear | nn.Conv1d | nn.Conv2d | nn.Conv3d) and weight is not None:
            int8 = grouped and any(re.search(p, name) for p in int8_weights)
            total += _matmul_weight_bytes(weight, recipe, group_size, int8)
        elif weight is not None:
            own["weight"] = weight
        total += sum(p.numel() * 4 for p in own.values())
    return total


def inference_cost(module: nn.Module, inputs: Sequence[Any], recipe: Recipe,
                   group_size: int = DEFAULT_GROUP_SIZE) -> Cost:
    """One eager inference counted: MACs by torch's FLOP counter (matmuls and convolutions),
    and the weights it reads (embedding rows as looked up in this very call)."""
    rows: dict[str, int] = {}
    names = {sub: name for name, sub in module.named_modules()}

    def looked_up(sub: nn.Module, args: tuple[Any, ...], _: Any) -> None:
        rows[names[sub]] = rows.get(names[sub], 0) + int(args[0].numel())

    hooks = [m.register_forward_hook(looked_up) for m in module.modules()
             if isinstance(m, nn.Embedding)]
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            module(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return Cost(counter.get_total_flops() // 2, weights_read(module, recipe, rows, group_size))


def decode_cost(model: PreTrainedModel, recipe: Recipe, context: int,
                group_size: int = DEFAULT_GROUP_SIZE) -> Cost:
    """One decode step of a Hugging Face decoder with `context` tokens in its cache: every
    linear once (one token's MACs are its weights' count), one embedding row, and the KV cache
    read (fp32, as the programs keep it) with its attention MACs."""
    config = model.config.get_text_config()
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    embedding = model.get_input_embeddings()
    rows = {name: 1 for name, m in model.named_modules() if m is embedding}
    kv_bytes = 2 * layers * context * kv_heads * head_dim * 4
    attention_macs = 2 * layers * heads * head_dim * context  # scores, then the weighted sum
    return Cost(sum(m.weight.numel() for m in linears) + attention_macs,
                weights_read(model, recipe, rows, group_size) + kv_bytes)


def int8_compute(recipe: Recipe) -> bool:
    """Whether the recipe's matmuls run as int8 GEMMs on the CPU (8-bit integer activations,
    static or dynamic, with integer weights)."""
    traits = recipe.traits
    return traits.activation_bits == 8 and traits.weight_bits is not None


def roofline(cost: Cost, peaks: HostPeaks, recipe: Recipe, measured_ms: float) -> dict[str, Any]:
    """The bound and how close `measured_ms` comes to it, as the bench rows record it."""
    int8 = int8_compute(recipe) and peaks.int8_gmac_s is not None
    gmac_s = peaks.int8_gmac_s if int8 and peaks.int8_gmac_s else peaks.fp32_gmac_s
    memory_ms = cost.bytes_read / (peaks.read_gb_s * 1e9) * 1e3
    compute_ms = cost.macs / (gmac_s * 1e9) * 1e3
    bound_ms = max(memory_ms, compute_ms)
    return {
        "macs": cost.macs,
        "bytes_read": cost.bytes_read,
        "macs_per_byte": round(cost.macs / cost.bytes_read, 2) if cost.bytes_read else None,
        "peak": "int8" if int8 else "fp32",
        "memory_ms": round(memory_ms, 4),
        "compute_ms": round(compute_ms, 4),
        "bound": "memory" if memory_ms >= compute_ms else "compute",
        "measured_ms": round(measured_ms, 4),
        "fraction": round(bound_ms / measured_ms, 3) if measured_ms > 0 else None,
    }

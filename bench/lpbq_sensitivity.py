"""Where 16a4w_block (LPBQ) loses SmolLM2-135M's accuracy: eager weight variants, float activations.

Each variant rewrites the model's linear weights as the HTP would hold them at 16a4w_block with
`--group-mapping asymmetric` (`qnn_quant.quantizers.lpbq`): per block of 32 input channels, the
min/max offset moved to a float offset (the offset linears), the rest symmetric int4 at one
scale per block, the block scales LPBQ's 4-bit multiples of the channel's largest / 16
(`lpbq_observer.lpbq_scales`). The variants separate the int4 range (-7..7, ExecuTorch's
per-block default, against -8..7, which holds Q4_1's 16 levels), the block-scale rounding (none,
LPBQ's 4 bits keeping the integers rounded to float scales as ExecuTorch's builder does, or
rounding the integers to the rounded scales as `LpbqWeightObserver` does, or 8-bit block
scales), and the LM head (the tied embedding, which GGUF does not hold on a Q4_1 grid)
quantized or float. Activations stay float: the 16-bit activations' share is the pipeline's.

    ./pants run bench/lpbq_sensitivity.py -- --windows 3
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from intx_sensitivity import Scoring, load, logits_of, metrics
from torch import nn

from qnn_quant.quantizers.lpbq_observer import lpbq_scales


@dataclass(frozen=True)
class Variant:
    qmin: int
    scale_bits: int  # 0: float block scales
    reround: bool = True  # integers rounded to the rounded block scales


VARIANTS: dict[str, Variant] = {
    "-7..7, float block scales": Variant(-7, 0),
    "-7..7, 4-bit, ints kept (ExecuTorch)": Variant(-7, 4, reround=False),
    "-8..7, float block scales": Variant(-8, 0),
    "-8..7, 4-bit, ints kept": Variant(-8, 4, reround=False),
    "-8..7, 4-bit (LpbqWeightObserver)": Variant(-8, 4),
    "-8..7, 8-bit block scales": Variant(-8, 8),
}


def lpbq_weight(weight: torch.Tensor, variant: Variant, block: int) -> torch.Tensor:
    """`weight` (out, in) as LPBQ with per-block float offsets holds it under `variant`, in
    blocks of `block` input channels."""
    out_f, in_f = weight.shape
    blocks = weight.reshape(out_f, in_f // block, block)
    low, high = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
    offset = low + 8 * (high - low) / 15  # as lpbq.split_group_offsets
    symmetric = blocks - offset
    qmax = 7
    if variant.qmin == -8:  # torchao's SYMMETRIC_NO_CLIPPING_ERR
        scale = torch.maximum(symmetric.amin(-1, keepdim=True) / -8,
                              symmetric.amax(-1, keepdim=True) / qmax)
    else:  # torchao's SYMMETRIC
        scale = symmetric.abs().amax(-1, keepdim=True) / ((qmax - variant.qmin) / 2)
    scale = scale.clamp(min=1e-12)
    levels = torch.clamp(torch.round(symmetric / scale), variant.qmin, qmax)
    if variant.scale_bits:
        rounded = lpbq_scales(scale, variant.scale_bits)
        if variant.reround:
            levels = torch.clamp(torch.round(symmetric / rounded), variant.qmin, qmax)
        scale = rounded
    return (levels * scale + offset).reshape(out_f, in_f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", type=int, default=32,
                        help="input channels per block (32: GGUF Q4_1's blocks)")
    parser.add_argument("--variants", nargs="+", default=["all"], choices=["all", *VARIANTS])
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/smollm2-fp32"))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, ids = load(args.cache)
    text = Scoring.of(model, ids, args.windows, args.length)
    windows, ref, fp32_ppl = text.windows, text.ref, text.fp32_ppl
    print(f"fp32: {sum(len(w) for w in windows)} tokens, perplexity {fp32_ppl:.3f}; "
          f"blocks of {args.block}", flush=True)
    print(f"{'variant':38s} {'head':>5s} {'argmax':>7s} {'SQNR dB':>8s} {'ppl':>8s} "
          f"{'ppl/fp32':>8s} {'s':>4s}", flush=True)
    names = list(VARIANTS) if args.variants == ["all"] else args.variants
    for name in names:
        variant = VARIANTS[name]
        for head in ("int4", "float"):
            t = time.perf_counter()
            quantized = copy.deepcopy(model)
            with torch.no_grad():
                for fqn, module in quantized.named_modules():
                    if not isinstance(module, nn.Linear) or (fqn == "lm_head" and head != "int4"):
                        continue
                    # A new Parameter: the head's weight is the (tied) embedding table.
                    held = lpbq_weight(module.weight.detach(), variant, args.block)
                    module.weight = nn.Parameter(held, requires_grad=False)
            out = logits_of(quantized, windows)
            ppl = text.perplexity(out)
            m = metrics(ref, out)
            print(f"{name:38s} {head:>5s} {m['argmax']:7.3f} {m['sqnr_db']:8.2f} {ppl:8.3f} "
                  f"{ppl / fp32_ppl:8.3f} {time.perf_counter() - t:4.0f}", flush=True)
            del quantized


if __name__ == "__main__":
    main()

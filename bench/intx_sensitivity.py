"""Where 8da4w loses SmolLM2-135M's accuracy: eager fake-quant variants against eager fp32.

Loads the built-in SmolLM2-135M-Instruct (fp32, dequantized from its GGUF) once, feeds windows
of the shipped public-domain text teacher-forced through full-sequence forwards (no export, no
KV cache), then applies torchao's `quantize_` to copies of the model's linears with one variant
each and reports next-token argmax agreement with fp32, logits SQNR and cosine, and perplexity.
Variants separate the weight error (weight-only int4) from the per-token int8 activation error
(activations only), compare scale choices and mappings, keep layer types float, and try the
split of min/max asymmetric groups (GGUF Q4_1's form) into a symmetric int4 weight, which
XNNPACK's qb4w kernels hold, plus a float offset per group applied to the group's input sum.

Run (one heavy process; the first run caches the fp32 weights under --cache):

    PYTHONPATH=src/python:tests:bench:/tmp/extra-llm:/tmp/extra-smol python \\
        bench/intx_sensitivity.py --variants all

`--list` prints the variant names.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qnn_quant.graph_params import INT4

GROUP = 32


@dataclass(frozen=True)
class Variant:
    """A way to fake-quantize the model's linears; `act_only` adds per-token int8 input fakes
    instead of a torchao config."""

    config: Callable[[], Any] | None
    keep_float: tuple[str, ...] = ()
    act_only: bool = False
    # Asymmetric groups as symmetric int4 (what XNNPACK's qb4w holds) plus a float offset per
    # group applied to the group's input sum; `offset_act` fakes the main GEMM's int8 input.
    offset: bool = False
    offset_act: bool = False
    # A config for the linears `keep_float` names, instead of leaving them float.
    head: Callable[[], Any] | None = None


def _dyn(algorithm: str = "hqq_scale_only", mapping: str = "SYMMETRIC") -> Any:
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, MappingType
    from torchao.quantization.granularity import PerGroup

    return Int8DynamicActivationIntxWeightConfig(
        weight_dtype=INT4,
        weight_granularity=PerGroup(GROUP),
        weight_mapping_type=getattr(MappingType, mapping),
        intx_choose_qparams_algorithm=algorithm,
    )


def _dyn8() -> Any:
    """8da8w: int8 per-token activations, int8 weights with one scale per output channel."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig
    from torchao.quantization.granularity import PerAxis

    return Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int8, weight_granularity=PerAxis(0)
    )


def _wo(algorithm: str = "hqq_scale_only", mapping: str = "SYMMETRIC") -> Any:
    from torchao.quantization import IntxWeightOnlyConfig, MappingType
    from torchao.quantization.granularity import PerGroup

    return IntxWeightOnlyConfig(
        weight_dtype=INT4,
        granularity=PerGroup(GROUP),
        mapping_type=getattr(MappingType, mapping),
        intx_choose_qparams_algorithm=algorithm,
    )


VARIANTS: dict[str, Variant] = {
    "8da4w": Variant(_dyn),
    "8da4w-head-float": Variant(_dyn, keep_float=("lm_head",)),
    "8da4w-affine": Variant(lambda: _dyn("affine")),
    "w4-only": Variant(_wo),
    "w4-only-affine": Variant(lambda: _wo("affine")),
    "w4-only-asym": Variant(lambda: _wo("affine", "ASYMMETRIC")),
    "a8-only": Variant(None, act_only=True),
    "a8-only-no-down": Variant(None, keep_float=("down_proj",), act_only=True),
    "8da4w-down-float": Variant(_dyn, keep_float=("down_proj",)),
    "8da4w-o-float": Variant(_dyn, keep_float=("o_proj",)),
    "8da4w-ends-float": Variant(_dyn, keep_float=(r"layers\.0\.", r"layers\.29\.")),
    "8da4w-asym": Variant(lambda: _dyn("affine", "ASYMMETRIC")),
    "w4-sym+offset": Variant(None, offset=True),
    "8da4w-sym+offset": Variant(None, offset=True, offset_act=True),
    "w4-sym+offset-head-float": Variant(None, keep_float=("lm_head",), offset=True),
    "8da4w-sym+offset-head-float": Variant(
        None, keep_float=("lm_head",), offset=True, offset_act=True
    ),
    "8da4w-sym+offset-head-8da4w": Variant(
        _dyn, keep_float=("lm_head",), offset=True, offset_act=True
    ),
    "8da4w-sym+offset-head-8da8w": Variant(
        _dyn8, keep_float=("lm_head",), offset=True, offset_act=True
    ),
    "8da4w-head-8da8w": Variant(_dyn, keep_float=("lm_head",), head=_dyn8),
}


class OffsetLinear(nn.Module):
    """y = x W_sym^T + groupsum(x) C^T: min/max asymmetric int4 groups (Q4_1's form, float
    minimum per group) split into a symmetric int4 weight and a per-group constant."""

    def __init__(self, weight: torch.Tensor, act: bool) -> None:
        super().__init__()
        out_f, in_f = weight.shape
        g = weight.reshape(out_f, in_f // GROUP, GROUP)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        d = ((hi - lo) / 15).clamp(min=torch.finfo(torch.float32).tiny)
        q = torch.round((g - lo) / d).clamp(0, 15) - 8  # int4, -8..7
        self.weight_sym = nn.Parameter((q * d).reshape(out_f, in_f), requires_grad=False)
        self.offset = nn.Parameter((lo + 8 * d).squeeze(-1), requires_grad=False)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        main = _fake_quant_tokens(x) if self.act else x
        sums = x.reshape(*x.shape[:-1], -1, GROUP).sum(-1)
        return nn.functional.linear(main, self.weight_sym) + nn.functional.linear(
            sums, self.offset
        )


def load(cache: Path) -> tuple[Any, list[int]]:
    """(fp32 LlamaForCausalLM, token ids of the shipped text), cached after the first load."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from qnn_prepare.causal_lm.tiny_decoders import text_bytes

    if not (cache / "state.pt").is_file():
        from qnn_prepare.causal_lm.smollm2 import _load_gguf

        tokenizer, model = _load_gguf(None)
        cache.mkdir(parents=True, exist_ok=True)
        model.config.to_json_file(str(cache / "config.json"))
        torch.save(model.state_dict(), cache / "state.pt")
        ids = tokenizer(text_bytes().decode("utf-8"))["input_ids"]
        (cache / "ids.json").write_text(json.dumps(ids))
    config = LlamaConfig.from_json_file(str(cache / "config.json"))
    model = LlamaForCausalLM(config)
    model.load_state_dict(torch.load(cache / "state.pt"), strict=False)
    model.tie_weights()
    return model.eval(), json.loads((cache / "ids.json").read_text())


@dataclass(frozen=True)
class Scoring:
    """Disjoint windows of the shipped text, each from position 0 (every position scored), the
    fp32 model's logits on them, and its perplexity."""

    windows: list[torch.Tensor]
    ref: torch.Tensor
    keep: torch.Tensor  # rows of the logits with a next token (not a window's last position)
    targets: torch.Tensor
    fp32_ppl: float

    @classmethod
    def of(cls, model: nn.Module, ids: list[int], count: int, length: int) -> Scoring:
        windows = [
            torch.tensor(ids[i * length : (i + 1) * length], dtype=torch.int64)
            for i in range(count)
        ]
        windows = [w for w in windows if len(w) == length]
        ref = logits_of(model, windows)
        keep = torch.cat([torch.arange(len(w) - 1) + i * len(w) for i, w in enumerate(windows)])
        targets = torch.cat([w[1:] for w in windows])
        ppl = math.exp(float(nn.functional.cross_entropy(ref[keep], targets)))
        return cls(windows, ref, keep, targets, ppl)

    def perplexity(self, logits: torch.Tensor) -> float:
        return math.exp(float(nn.functional.cross_entropy(logits[self.keep], self.targets)))


def _fake_quant_tokens(x: torch.Tensor) -> torch.Tensor:
    """Per-token asymmetric int8 quantize + dequantize, as torchao's 8da4w activations."""
    lo = x.amin(-1, keepdim=True).clamp(max=0)
    hi = x.amax(-1, keepdim=True).clamp(min=0)
    scale = ((hi - lo) / 255).clamp(min=torch.finfo(torch.float32).eps)
    zero = (-128 - torch.round(lo / scale)).clamp(-128, 127)
    q = torch.clamp(torch.round(x / scale) + zero, -128, 127)
    return (q - zero) * scale


def apply(model: nn.Module, variant: Variant) -> int:
    """Quantize `model`'s linears in place per `variant`; returns how many were quantized."""
    import re

    from torchao.quantization import quantize_

    patterns = [re.compile(p) for p in variant.keep_float]
    chosen = {
        name for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and not any(p.search(name) for p in patterns)
    }
    if variant.act_only:
        for name, m in model.named_modules():
            if name in chosen:
                m.register_forward_pre_hook(lambda _m, args: (_fake_quant_tokens(args[0]),))
        return len(chosen)
    if variant.offset:
        for name in sorted(chosen):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            weight = getattr(parent, child).weight.detach()
            setattr(parent, child, OffsetLinear(weight, variant.offset_act))
        if variant.config is not None:  # the float-kept linears get the torchao config
            rest = {
                name for name, m in model.named_modules()
                if isinstance(m, nn.Linear) and name not in chosen
            }
            with torch.no_grad():
                quantize_(model, variant.config(), filter_fn=lambda _m, fqn: fqn in rest)
            return len(chosen) + len(rest)
        return len(chosen)
    assert variant.config is not None
    with torch.no_grad():
        quantize_(model, variant.config(), filter_fn=lambda _m, fqn: fqn in chosen)
        if variant.head is not None:
            quantize_(model, variant.head(), filter_fn=lambda m, fqn: (
                isinstance(m, nn.Linear) and fqn not in chosen))
    return len(chosen)


def logits_of(model: nn.Module, windows: list[torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(input_ids=w[None]).logits[0].float() for w in windows])


def metrics(ref: torch.Tensor, out: torch.Tensor) -> dict[str, float]:
    noise = (out - ref).pow(2).sum()
    return {
        "argmax": float((out.argmax(-1) == ref.argmax(-1)).float().mean()),
        "sqnr_db": float(10 * torch.log10(ref.pow(2).sum() / noise)) if noise > 0 else math.inf,
        "cosine": float(torch.nn.functional.cosine_similarity(out, ref, dim=-1).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["all"])
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/smollm2-fp32"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    if args.list:
        print("\n".join(VARIANTS))
        return
    torch.set_num_threads(args.threads)
    names = list(VARIANTS) if args.variants == ["all"] else args.variants
    model, ids = load(args.cache)
    text = Scoring.of(model, ids, args.windows, args.length)
    windows, ref, fp32_ppl = text.windows, text.ref, text.fp32_ppl
    print(f"fp32: {sum(len(w) for w in windows)} tokens, perplexity {fp32_ppl:.3f}", flush=True)
    print(f"{'variant':28s} {'linears':>7s} {'argmax':>7s} {'SQNR dB':>8s} {'cosine':>7s} "
          f"{'ppl':>8s} {'ppl/fp32':>8s} {'s':>5s}", flush=True)
    for name in names:
        t = time.perf_counter()
        quantized = copy.deepcopy(model)
        n = apply(quantized, VARIANTS[name])
        out = logits_of(quantized, windows)
        m = {**metrics(ref, out), "ppl": text.perplexity(out)}
        print(f"{name:28s} {n:7d} {m['argmax']:7.3f} {m['sqnr_db']:8.2f} {m['cosine']:7.4f} "
              f"{m['ppl']:8.3f} {m['ppl'] / fp32_ppl:8.3f} {time.perf_counter() - t:5.0f}",
              flush=True)
        del quantized


if __name__ == "__main__":
    main()

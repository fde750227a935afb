"""What 8da4w's smoothed blocks do to SmolLM2-135M's perplexity, over several draws of the
rounding noise.

Per-token int8 activations re-draw every rounding of a token when anything upstream moves, so
one perplexity figure of 669 held-out tokens is one draw (about +-2 %: docs/known-limits.md).
This runs the eager model (fp32, its exact GGUF weights: no weight error) with every linear's
input rounded as 8da4w rounds it (`qnn_quant.smoothed_blocks.per_token_int8`, the function
the factors are chosen with), `--draws` times with the input embeddings jittered by 1e-4 (draw
0: none), for three settings:

- none: upstream's plain 8da4w;
- norms: each RMSNorm's input to q / k / v and gate / up smoothed;
- norms+down: the down projections' inputs as well (the default).

The factors are chosen as the quantize stage chooses them (`choose_scale`, the first 4
calibration windows of the shipped text), here over full-sequence eager forwards instead of the
exported prefill / decode. Run (a few minutes on 2 cores):

    PYTHONPATH=src/python:bench python bench/smoothing_draws.py --json /tmp/smoothing.json
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qnn_quant.smoothed_blocks import choose_scale, per_token_int8
from qnn_quant.smoothing_stats import TEXTS

GROUP = 32
JITTER = 1e-4
WINDOW = 128
SETTINGS: dict[str, Callable[[str], bool]] = {
    "none": lambda path: False,
    "norms": lambda path: not path.endswith("down_proj"),
    "norms+down": lambda path: True,
}


def _windows(tokenizer: Any, text: str) -> list[torch.Tensor]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [torch.tensor(ids[i : i + WINDOW]) for i in range(0, len(ids) - 1, WINDOW)
            if len(ids[i : i + WINDOW]) > 1]


def _perplexity(model: nn.Module, windows: list[torch.Tensor]) -> float:
    nll, count = 0.0, 0
    with torch.no_grad():
        for w in windows:
            logits = model(input_ids=w[None], use_cache=False).logits[0].float()
            nll += float(nn.functional.cross_entropy(logits[:-1], w[1:], reduction="sum"))
            count += len(w) - 1
    return math.exp(nll / count)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=6)
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()

    from qnn_prepare.causal_lm.export import HELD_OUT
    from qnn_prepare.causal_lm.smollm2 import _load_gguf

    torch.manual_seed(0)
    tokenizer, model = _load_gguf(None)
    held_out = _windows(tokenizer, HELD_OUT.eval)
    calibration = _windows(tokenizer, HELD_OUT.calibration)[:TEXTS]
    layers = model.model.layers
    # Linears that read one input (its first reader names it) -> the linears reading it.
    inputs: dict[str, list[nn.Linear]] = {}
    for i, layer in enumerate(layers):
        inputs[f"{i}.q_proj"] = [layer.self_attn.q_proj, layer.self_attn.k_proj,
                                 layer.self_attn.v_proj]
        inputs[f"{i}.gate_proj"] = [layer.mlp.gate_proj, layer.mlp.up_proj]
        inputs[f"{i}.down_proj"] = [layer.mlp.down_proj]
    reader = {id(lin): name for name, lins in inputs.items() for lin in lins}
    state: dict[str, Any] = {"mode": "float", "divide": {}, "rows": {}}

    def pre_hook(module: nn.Module, hook_args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        x = hook_args[0]
        name = reader.get(id(module))
        if state["mode"] == "record":
            if name is not None and module is inputs[name][0]:
                state["rows"].setdefault(name, []).append(x.detach().reshape(-1, x.shape[-1]))
            return None
        if state["mode"] == "float" or name is None and module is not model.lm_head:
            return None
        divide = state["divide"].get(name)
        if divide is None:
            return (per_token_int8(x),)
        return (per_token_int8(x / divide) * divide,)

    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.register_forward_pre_hook(pre_hook)

    def jitter(module: nn.Module, hook_args: tuple[Any, ...], out: torch.Tensor) -> Any:
        return out + state["jitter"] * torch.randn_like(out) if state.get("jitter") else None

    model.model.embed_tokens.register_forward_hook(jitter)

    state["mode"] = "record"
    _perplexity(model, calibration)
    chosen: dict[str, torch.Tensor] = {}
    factors: dict[str, int] = {}
    for name, rows in state["rows"].items():
        scale = choose_scale((name,), torch.cat(rows),
                             [lin.weight for lin in inputs[name]], GROUP)
        factors[name] = scale.factor
        divide = torch.ones(rows[0].shape[-1])
        divide[scale.block * GROUP : (scale.block + 1) * GROUP] = scale.factor
        chosen[name] = divide
    state["mode"] = "float"
    fp32 = _perplexity(model, held_out)
    results: dict[str, Any] = {"bench": "smoothing", "fp32_perplexity": round(fp32, 4),
                               "tokens": sum(len(w) - 1 for w in held_out), "rows": []}
    print(f"fp32 perplexity {fp32:.3f} over {results['tokens']} held-out tokens; "
          f"{sum(f > 1 for f in factors.values())} of {len(factors)} inputs divided")
    for setting, applies in SETTINGS.items():
        state["mode"] = "int8"
        state["divide"] = {n: d for n, d in chosen.items() if applies(n) and factors[n] > 1}
        draws = []
        for d in range(args.draws):
            torch.manual_seed(d)
            state["jitter"] = JITTER if d else 0.0
            draws.append(100 * (_perplexity(model, held_out) / fp32 - 1))
        mean = sum(draws) / len(draws)
        results["rows"].append({"setting": setting, "vs_fp32_percent": [round(v, 2) for v in draws],
                                "mean": round(mean, 2)})
        print(f"{setting:11s} " + " ".join(f"{v:+.2f}" for v in draws)
              + f"  mean {mean:+.2f} %", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

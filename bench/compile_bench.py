"""Benchmark: compile seconds per decoder layer as a decoder deepens, and each stage's peak RSS.

Run: `./pants run bench/compile_bench.py -- --layers 2 4 8 16 30 --json compile.json`

The decoder is SmolLM2-135M's architecture (Llama: hidden 576, 9 / 3 heads, intermediate 1536,
vocab 49,152, tied embeddings, rope theta 1e5) with seeded random weights built from a
transformers `LlamaConfig` (no download), at each `--layers` depth. Per depth, each stage runs
as its own CLI process (`stage_process.run_stage`, for its peak RSS): prepare with a KV cache
(prefill + decode), quantize (`--recipe`, XNNPACK), compile. Reported: the compile stage's
lowering seconds (`lower_s` in its manifest), that per layer, the marginal seconds per layer
between consecutive depths (what flat cost means: the embedding and LM head are paid once), and
peak RSS per stage. With `--stock-up-to N`, depths up to N are lowered again in this process with
ExecuTorch's own partition merge (`fast_partitioning=False`), for the before / after ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from stage_process import run_stage
from tables import render

from qnn_common.config import CompileConfig
from qnn_common.recipes import Backend, Recipe
from qnn_common.sealing import load_manifest
from qnn_common.stages import program_files
from qnn_common.torchio.programs import load_program
from qnn_compile.backends import lowering_for
from qnn_compile.lower import lower_program

# SmolLM2-135M's config.json, less its depth.
SMOLLM2_SHAPE: dict[str, Any] = dict(
    hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
    vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
    max_position_embeddings=8192, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
    pad_token_id=2,
)


def save_decoder(layers: int, directory: Path, seed: int = 1126) -> Path:
    """A SmolLM2-shaped Llama with `layers` decoder layers and seeded random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, **SMOLLM2_SHAPE)).save_pretrained(
        directory
    )
    return directory


def _stock_lower_s(source: Path, recipe: Recipe) -> float:
    """Seconds of lowering `source`'s methods with ExecuTorch's own partition merge."""
    manifest = load_manifest(source)
    programs = {m: load_program(source / f) for m, f in program_files(source, manifest).items()}
    lowering = lowering_for(CompileConfig(backend=Backend.XNNPACK, recipe=recipe))
    t = time.perf_counter()
    lower_program(programs, lowering, fast_partitioning=False)
    return time.perf_counter() - t


def bench(layers: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One depth: every stage as a process, then optionally the stock lowering."""
    root = work / f"l{layers}"
    model = save_decoder(layers, root / "hf")
    prep, quant, comp = root / "prepare", root / "quantize", root / "compile"
    shapes = ["--max-seq-len", str(args.max_seq_len), "--prefill-len", str(args.prefill_len)]
    steps = [
        ("prepare", ["qnn_prepare.cli", "--model", str(model), "--kv-cache", *shapes,
                     *(["--custom-ops"] if args.custom_ops else []),
                     "--calibration-samples", str(args.calibration_samples), "-o", str(prep),
                     "-q"]),
        ("quantize", ["qnn_quant.cli", str(prep), "--backend", "xnnpack", "--recipe",
                      args.recipe, "-o", str(quant), "-q"]),
        ("compile", ["qnn_compile.cli", str(quant), "--recipe", args.recipe, "-o", str(comp),
                     "-q"]),
    ]
    row: dict[str, Any] = {"layers": layers, "seconds": {}, "peak_rss_mb": {}}
    for name, argv in steps:
        seconds, rss = run_stage(argv, root)
        row["seconds"][name], row["peak_rss_mb"][name] = round(seconds, 1), round(rss)
        print(f"  {layers} layers: {name} {seconds:.0f} s, peak RSS {rss:.0f} MB", flush=True)
    manifest = json.loads((comp / "manifest.json").read_text())
    row["lower_s"] = round(manifest["timings"]["lower_s"], 1)
    row["partitions"] = manifest["metrics"]["partitions"]
    row["pte_bytes"] = manifest["metrics"]["pte_bytes"]
    if layers <= args.stock_up_to:
        row["stock_lower_s"] = round(_stock_lower_s(quant, Recipe(args.recipe)), 1)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, nargs="+", default=[2, 4, 8, 16, 30])
    p.add_argument("--recipe", default="8a8w")
    p.add_argument("--no-custom-ops", dest="custom_ops", action="store_false",
                   help="the KV cache as plain ATen ops, not ExecuTorch's LLM custom ops (the "
                   "pipeline's default for xnnpack)")
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--prefill-len", type=int, default=32)
    p.add_argument("--calibration-samples", type=int, default=4)
    p.add_argument("--stock-up-to", type=int, default=0,
                   help="also lower depths up to this with the stock partition merge")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench(layers, args, Path(tmp)) for layers in sorted(args.layers)]
    result = {
        "bench": "compile",
        "model": "SmolLM2-135M architecture, seeded random weights", "recipe": args.recipe,
        "custom_ops": args.custom_ops,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['model']}, {args.recipe} XNNPACK, prefill + decode over a "
          f"{args.max_seq_len}-token cache; {result['machine']}, {result['date']}")
    print(render(result))

if __name__ == "__main__":
    main()

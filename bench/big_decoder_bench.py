"""Benchmark: a 0.5-1B-class decoder prepared, quantized and compiled for the HTP, compile-only:
seconds and peak RSS per stage, and per shard its context's bytes (estimated and measured) and
build seconds.

Run: `./pants run bench/big_decoder_bench.py -- --arch qwen2.5-0.5b --layers 2`
(`--layers 0`: the whole depth; about 15 minutes and 16 GB for the 1B, see docs/qnn.md.)

The architectures are the public configs of Llama-3.2-1B (hidden 2048, 16 layers, 32 / 8 heads,
intermediate 8192, vocab 128,256, tied embeddings, rope theta 500,000 with llama3 scaling) and
Qwen2.5-0.5B (hidden 896, 24 layers, 14 / 2 heads, intermediate 4864, vocab 151,936, tied), with
seeded random weights (real ones cannot be fetched here): what is measured is memory and time,
which do not depend on the values (the byte tokenizer stands in for the real one). Each stage
runs as its own CLI process (`stage_process.run_stage`, for its peak RSS): prepare with the KV
cache as the methods' inputs and outputs, quantize for QNN (`--recipe`, nearest rounding unless
`--gptq`), compile with `--num-shards` (default auto) and a context cache. Prints a Markdown
table (`tables.big_decoder`); `--json` writes the rows, the machine and the date.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import tables
import torch
from stage_process import run_stage

from qnn_common.sealing import load_manifest
from qnn_prepare.causal_lm.tiny_decoders import byte_tokenizer

ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-3.2-1b": ("llama", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
        rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        bos_token_id=128000, eos_token_id=128001,
    )),
    "qwen2.5-0.5b": ("qwen2", dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
        rope_theta=1000000.0, max_position_embeddings=32768, rms_norm_eps=1e-6,
        bos_token_id=151643, eos_token_id=151643,
    )),
}


def save_decoder(arch: str, layers: int, directory: Path, seed: int = 1126) -> tuple[Path, int]:
    """`arch` with seeded weights, its first `layers` layers (0: all), as a HF directory;
    returns it and its parameter count."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    family, shape = ARCHS[arch]
    shape = {**shape, **({"num_hidden_layers": layers} if layers else {})}
    torch.manual_seed(seed)
    model: Any = (LlamaForCausalLM(LlamaConfig(**shape)) if family == "llama"
                  else Qwen2ForCausalLM(Qwen2Config(**shape)))
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(directory)
    # Token ids only index the embedding: the byte tokenizer's 256 are as good as the real
    # vocabulary's for time and memory, and need no download.
    byte_tokenizer().save_pretrained(directory)
    del model
    return directory, params


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", choices=sorted(ARCHS), default="qwen2.5-0.5b")
    p.add_argument("--layers", type=int, default=2, help="the first N layers (0: all)")
    p.add_argument("--recipe", default="16a4w", help="default: %(default)s")
    p.add_argument("--soc", default="SM8650")
    p.add_argument("--num-shards", default="auto")
    p.add_argument("--gptq", action="store_true", help="GPTQ weight rounding (default: nearest)")
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--prefill-len", type=int, default=32)
    p.add_argument("--calibration-samples", type=int, default=2)
    p.add_argument("--work", type=Path, help="keep the artifacts here (default: a temp dir)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="big-decoder-") as tmp:
        work = args.work or Path(tmp)
        t = time.perf_counter()
        model, params = save_decoder(args.arch, args.layers, work / "hf")
        print(f"{args.arch} ({args.layers or 'all'} layers, {params / 1e6:.0f} M parameters) "
              f"written in {time.perf_counter() - t:.0f} s", flush=True)
        target = ["--backend", "qnn", "--soc", args.soc]
        prep, quant, comp = work / "prepare", work / "quantize", work / "compile"
        rounding = [] if args.gptq else ["--weight-rounding", "nearest"]
        steps = [
            ("prepare", ["qnn_prepare.cli", "--model", str(model), "--kv-cache", "--kv-io",
                         "--max-seq-len", str(args.max_seq_len),
                         "--prefill-len", str(args.prefill_len),
                         "--calibration-samples", str(args.calibration_samples),
                         "--eval-samples", "1", "-o", str(prep), "-q"]),
            ("quantize", ["qnn_quant.cli", str(prep), *target, "--recipe", args.recipe,
                          *rounding, "--report-layers", "0", "-o", str(quant), "-q"]),
            ("compile", ["qnn_compile.cli", str(quant), *target, "--recipe", args.recipe,
                         "--num-shards", args.num_shards,
                         "--context-cache", str(work / "contexts"), "-o", str(comp), "-q"]),
        ]
        stages: dict[str, dict[str, float]] = {}
        for name, argv in steps:
            seconds, rss = run_stage(argv, work)
            stages[name] = {"seconds": round(seconds, 1), "peak_rss_mb": round(rss)}
            print(f"{name}: {seconds:.0f} s, peak RSS {rss:.0f} MB", flush=True)
        metrics = load_manifest(comp).metrics
        shards = metrics.get("shards", {}).get("shards", [])
        contexts = metrics.get("contexts", [])

    row = {
        "arch": args.arch, "layers": args.layers, "parameters": params, "recipe": args.recipe,
        "soc": args.soc, "stages": stages, "shards": shards, "contexts": contexts,
        "pte_bytes": metrics["pte_bytes"],
    }
    result = {"bench": "big_decoder", "rows": [row], "machine": platform.node(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(f"\n{tables.render(result)}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

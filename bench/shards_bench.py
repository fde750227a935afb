"""Benchmark: one causal LM compiled for the HTP at several shard counts (`--num-shards`).

Run: `./pants run bench/shards_bench.py -- --layers 4 --shards 1 2 3`
(`--layers 0`: the whole SmolLM2-135M, 30 layers; minutes per shard count on the emulator.)

SmolLM2-135M with its real weights (a slice of its first `--layers` layers, or all of it) is
prepared and quantized once; then for each shard count, each stage its own CLI process: compile
(seconds, peak RSS, .pte bytes, each context's bytes and build seconds; then the same compile
again with its last context removed from the context cache, as a compile killed while building
it would leave it) and infer on the x86 HTP emulator (greedy
tokens for a prompt). Each program's teacher-forced logits on the eval texts are compared with
the one-shard program's: a split must compute what the whole does (fp16: >= 60 dB is issue 26's
bar; a quantized recipe's cut hands over the dequantized tensor and requantizes it with the same
scale). Prints a Markdown table; `--json` writes the rows, the machine and the date.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from stage_process import run_stage

from qnn_common.numerics.metrics import sqnr_db
from qnn_common.sealing import load_manifest
from qnn_infer.families.causal_lm import program_logits
from qnn_prepare.causal_lm.smollm2 import SMOLLM2, save_smollm2

PROMPT = "The capital of France is"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4,
                   help="SmolLM2's first N layers (0: all 30; default: %(default)s)")
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--recipe", default="fp16", help="default: %(default)s")
    p.add_argument("--soc", default="SM8650")
    p.add_argument("--max-seq-len", type=int, default=64)
    p.add_argument("--prefill-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=4)
    p.add_argument("--work", type=Path, help="keep the artifacts here (default: a temp dir)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    if 1 not in args.shards:
        p.error("--shards must include 1: every other count is compared with it")

    with tempfile.TemporaryDirectory(prefix="shards-bench-") as tmp:
        work = args.work or Path(tmp)
        model = SMOLLM2 if args.layers == 0 else str(
            save_smollm2(work / "model", num_layers=args.layers)
        )
        target = ["--backend", "qnn", "--soc", args.soc]
        prep, quant = work / "prepare", work / "quantize"
        steps = [["qnn_prepare.cli", "--model", model, "--kv-cache", "--kv-io",
                  "--max-seq-len", str(args.max_seq_len), "--prefill-len", str(args.prefill_len),
                  "--calibration-samples", "4", "-o", str(prep), "-q"]]
        source = prep
        if args.recipe not in ("fp16",):
            steps.append(["qnn_quant.cli", str(prep), *target, "--recipe", args.recipe,
                          "-o", str(quant), "-q"])
            source = quant
        for argv in steps:
            run_stage(argv, work)
        rows: list[dict[str, Any]] = []
        reference: list[torch.Tensor] = []
        for shards in sorted(args.shards):
            comp, inf = work / f"compile-{shards}", work / f"infer-{shards}"
            cache = work / f"contexts-{shards}"
            compile_argv = ["qnn_compile.cli", str(source), *target, "--recipe", args.recipe,
                            "--num-shards", str(shards), "--context-cache", str(cache), "-q"]
            seconds, rss = run_stage([*compile_argv, "-o", str(comp)], work)
            built = load_manifest(comp).metrics["contexts"]
            # A compile killed while building its last context, run again: the other contexts
            # come from the cache (qnn_compile.context_cache).
            (cache / f"{built[-1]['key']}.ctx").unlink()
            resume_s, _ = run_stage([*compile_argv, "-o", str(work / f"resume-{shards}")], work)
            resumed = load_manifest(work / f"resume-{shards}").metrics["contexts"]
            assert [c["reused"] for c in resumed] == [True] * (len(built) - 1) + [False], resumed
            run_stage(["qnn_infer.cli", str(comp), "--prompt", PROMPT, "--no-stream",
                       "--max-new-tokens", str(args.new_tokens), "-o", str(inf), "-q"], work)
            metrics = load_manifest(comp).metrics
            t = time.perf_counter()
            logits = program_logits(comp)
            if shards == 1:
                reference = logits
            generation = load_manifest(inf).metrics["generation"]
            rows.append({
                "shards": shards,
                "compile_s": round(seconds, 1),
                "compile_peak_rss_mb": round(rss),
                "context_build_s": [c["seconds"] for c in built],
                "resume_last_shard_s": round(resume_s, 1),
                "pte_bytes": metrics["pte_bytes"],
                "context_bytes": metrics["delegate_bytes"].get("prefill"),
                "tokens": generation["token_ids"],
                "text": generation["text"],
                "sqnr_db_vs_1_shard": min(
                    sqnr_db(r, x) for r, x in zip(reference, logits, strict=True)
                ),
                "teacher_forced_s": round(time.perf_counter() - t, 1),
            })
            print(json.dumps(rows[-1]), flush=True)

    name = SMOLLM2 if args.layers == 0 else f"{SMOLLM2} (first {args.layers} layers)"
    print(f"\n{name}, {args.recipe}, {args.soc} on the x86 HTP emulator\n")
    print("| shards | compile s | context build s | rerun, last context lost, s | "
          "compile peak RSS MB | .pte bytes | contexts (bytes) | logits vs 1 shard dB | "
          "same tokens as 1 shard |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['shards']} | {row['compile_s']} | "
              f"{' + '.join(f'{s:.1f}' for s in row['context_build_s'])} | "
              f"{row['resume_last_shard_s']} | {row['compile_peak_rss_mb']} | "
              f"{row['pte_bytes']:,} | {', '.join(f'{b:,}' for b in row['context_bytes'])} | "
              f"{row['sqnr_db_vs_1_shard']:.1f} | {row['tokens'] == rows[0]['tokens']} |")
    if args.json:
        args.json.write_text(json.dumps({
            "rows": rows, "recipe": args.recipe, "layers": args.layers, "soc": args.soc,
            "machine": platform.node(), "date": time.strftime("%Y-%m-%d"),
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()

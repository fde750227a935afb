"""Benchmark: a causal LM's .pte (prefill + decode over a KV cache) against eager Hugging Face.

Run: `./pants run bench/llm_bench.py -- --model tiny-llama --recipes fp32 8a8w`

In one process, on the same model, prompt and number of new tokens, both greedy:
- eager HF `generate` (its own dynamic KV cache): decode tokens/s;
- the pipeline's program, per recipe: stage seconds, .pte bytes, time to first token, prefill and
  decode tokens/s, and the ratio of decode tokens/s to eager's;
- per recipe, how many of the program's greedy tokens are eager's (an fp32 program: all of them;
  a quantized one goes its own way after a few);
- the size of the one two-method .pte against the same two methods lowered as separate files;
- peak RSS of each stage, each run as its own CLI process (`os.wait4` reports the child's peak);
- with `--llama-cpp-python PYTHON` and `--model smollm2-135m`: llama.cpp on the GGUF file the
  model comes from (`llama_cpp_peer.py`, run by that interpreter), same prompt token ids, threads
  and new tokens; our decode tokens/s as a ratio of its;
- on the CPU backends, each program's decode roofline (`roofline.py`): a step's MACs and bytes
  read (weights at the recipe's width, one embedding row, the KV cache at the middle of the
  generation) against this host's measured peaks at the bench's threads, and the fraction of
  that limit the measured decode step reaches.
Only ratios measured side by side mean anything on these noisy machines. Writes JSON with
`--json` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from host import describe_host
from roofline import decode_cost, probe_host, roofline
from stage_process import run_stage
from tables import render

from qnn_common.config import CompileConfig, PrepareConfig
from qnn_common.recipes import BACKENDS, Backend, Recipe
from qnn_common.stages import method_program
from qnn_common.torchio.programs import load_program
from qnn_compile.backends import lowering_for
from qnn_compile.lower import lower_program
from qnn_prepare.causal_lm.smollm2 import SMOLLM2, gguf_path, save_smollm2
from qnn_prepare.causal_lm.tiny_decoders import save_tiny_decoder

_PREPARE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PrepareConfig)}

PROMPT = "Once upon a time"
PEER = Path(__file__).with_name("llama_cpp_peer.py")


def _eager(model_dir: Path, new_tokens: int, runs: int) -> tuple[float, list[int]]:
    """Greedy HF generate: tokens after the first per second (prefill timed separately), and the
    tokens it picks after the prompt when left to stop at its end-of-sequence token (the timed
    calls are held to `new_tokens`, which changes what follows a suppressed stop)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    ids = tokenizer(PROMPT, add_special_tokens=False, return_tensors="pt")["input_ids"]
    pad = tokenizer.pad_token_id
    best = 0.0
    with torch.no_grad():
        for _ in range(runs):
            t = time.perf_counter()
            model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=pad)
            first = time.perf_counter() - t
            t = time.perf_counter()
            model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=False, pad_token_id=pad)
            rest = time.perf_counter() - t - first
            best = max(best, (new_tokens - 1) / rest)
        greedy = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
    return best, [int(t) for t in greedy[0, ids.shape[1]:]]


def same_leading_tokens(ours: list[int], eager: list[int]) -> dict[str, int]:
    """How many of our first tokens are eager's, of how many we generated."""
    same = 0
    for a, b in zip(ours, eager, strict=False):
        if a != b:
            break
        same += 1
    return {"same": same, "of": len(ours)}


def _run(
    model: str, recipe: str, work: Path, args: argparse.Namespace, eager_tokens: list[int]
) -> dict[str, Any]:
    shapes = ["--max-seq-len", str(args.max_seq_len), "--prefill-len", str(args.prefill_len)]
    prep, quant, comp, inf = (work / recipe / s
                              for s in ("prepare", "quantize", "compile", "infer"))
    row: dict[str, Any] = {"recipe": recipe, "backend": args.backend, "seconds": {},
                           "peak_rss_mb": {}}
    qnn = args.backend == "qnn"
    target = ["--backend", args.backend] + (["--soc", args.soc] if qnn else [])
    # The cache as the pipeline keeps it for this backend: on the host (QNN), or written by
    # ExecuTorch's LLM custom ops (XNNPACK) unless --no-custom-ops.
    custom_ops = BACKENDS[Backend(args.backend)].llm_custom_ops and args.custom_ops
    steps = [("prepare", ["qnn_prepare.cli", "--model", model, "--kv-cache", *shapes,
                          *(["--kv-io"] if qnn else []), *(["--custom-ops"] if custom_ops else []),
                          "--calibration-samples", str(args.calibration_samples),
                          "-o", str(prep), "-q"])]
    source = prep
    if recipe not in ("fp32", "fp16"):
        steps.append(("quantize", ["qnn_quant.cli", str(prep), *target, "--recipe", recipe,
                                   "-o", str(quant), "-q"]))
        source = quant
    steps.append(("compile", ["qnn_compile.cli", str(source), *target, "--recipe", recipe,
                              "-o", str(comp), "-q"]))
    if qnn:  # the device program: one copy of the weights for both methods
        steps.append(("compile_shared", ["qnn_compile.cli", str(source), *target, "--recipe",
                                         recipe, "--weight-sharing", "-o",
                                         str(work / recipe / "shared"), "-q"]))
    steps.append(("infer", ["qnn_infer.cli", str(comp), "--prompt", PROMPT, "--no-stream",
                            "--max-new-tokens", str(args.new_tokens), "--threads",
                            str(args.threads), "-o", str(inf), "-q"]))
    for name, argv in steps:
        seconds, rss = run_stage(argv, work)
        row["seconds"][name], row["peak_rss_mb"][name] = round(seconds, 1), round(rss)
    metrics = json.loads((inf / "manifest.json").read_text())["metrics"]
    row["generation"] = {k: metrics["generation"][k] for k in (
        "ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "new_tokens")}
    # Greedy both: an fp32 program generates eager's tokens; a quantized one, a prefix of them.
    row["tokens_vs_eager"] = same_leading_tokens(metrics["generation"]["token_ids"], eager_tokens)
    row["argmax_agreement_vs_eager"] = metrics["accuracy"]["vs_fp32"]["argmax_agreement"]
    row["perplexity"] = metrics["accuracy"]["perplexity"]  # held-out text: fp32, fake quant, .pte
    row["sqnr_db"] = {k: round(metrics["accuracy"][k]["sqnr_db"], 1)  # teacher-forced logits
                      for k in ("vs_fp32", "vs_fake_quant") if k in metrics["accuracy"]}
    row["pte_bytes"] = (comp / "model.pte").stat().st_size
    if qnn:
        row["shared_pte_bytes"] = (work / recipe / "shared" / "model.pte").stat().st_size
    row["separate_pte_bytes"] = (
        None if args.no_separate or qnn else _separate_size(source, recipe)
    )
    return row


def _separate_size(source: Path, recipe: str) -> int:
    """Bytes of prefill and decode lowered as two single-method .pte files."""
    lowering = lowering_for(CompileConfig(recipe=Recipe(recipe)))
    return sum(
        len(lower_program(load_program(source / method_program(m)), lowering).pte)
        for m in ("prefill", "decode")
    )


def _add_decode_roofline(rows: list[dict[str, Any]], model_dir: Path, peaks: Any,
                         new_tokens: int) -> None:
    """Each row's decode step against the host's limit (the emulator's rows have none)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    prompt = len(AutoTokenizer.from_pretrained(str(model_dir))(
        PROMPT, add_special_tokens=False)["input_ids"])
    for row in rows:
        step_ms = 1e3 / row["generation"]["decode_tokens_per_s"]
        cost = decode_cost(model, Recipe(row["recipe"]), context=prompt + new_tokens // 2)
        row["decode_roofline"] = roofline(cost, peaks, Recipe(row["recipe"]), step_ms)


def _llama_cpp(python: str, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """llama.cpp's greedy run on the model's GGUF, with our tokenizer's prompt ids."""
    import subprocess

    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(model_dir))(PROMPT, add_special_tokens=False)
    proc = subprocess.run(
        [python, str(PEER), str(gguf_path()), "--prompt-ids",
         ",".join(str(i) for i in ids["input_ids"]), "--new-tokens", str(args.new_tokens),
         "--threads", str(args.threads), "--n-ctx", str(args.max_seq_len),
         "--runs", str(args.runs)],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"llama.cpp peer failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--recipes", nargs="+", default=["fp32", "8a8w"])
    p.add_argument("--backend", choices=["xnnpack", "portable", "qnn"], default="xnnpack",
                   help="qnn: compiled for --soc and run on the x86 HTP emulator (slow: a "
                   "few new tokens are enough), and compiled again with --weight-sharing for "
                   "the device program's size")
    p.add_argument("--soc", default="SM8650", help="qnn: the SoC (default: %(default)s)")
    p.add_argument("--calibration-samples", type=int,
                   default=_PREPARE_DEFAULTS["calibration_samples"],
                   help="calibration windows, half of them chat-formatted for an instruct "
                   "model (default: the pipeline's, %(default)s)")
    p.add_argument("--no-custom-ops", dest="custom_ops", action="store_false",
                   help="xnnpack: the KV cache as plain ATen ops, not ExecuTorch's LLM custom ops")
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--prefill-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="CPU threads of our runtime and of llama.cpp (default: every core)")
    p.add_argument("--llama-cpp-python", metavar="PYTHON",
                   help=f"an interpreter with llama-cpp-python: compare with llama.cpp on the "
                   f"GGUF file ({SMOLLM2} only)")
    p.add_argument("--no-separate", action="store_true",
                   help="skip lowering prefill and decode again as two files (the shared-weights "
                   "size check: two more compiles, minutes on a real model)")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()
    if args.llama_cpp_python and args.model != SMOLLM2:
        p.error(f"--llama-cpp-python runs the GGUF file {SMOLLM2} comes from; use --model "
                f"{SMOLLM2}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.model.startswith("tiny-"):
            model_dir = save_tiny_decoder(args.model, work / "hf")
        elif args.model == SMOLLM2:
            model_dir = save_smollm2(work / "hf")
        else:
            model_dir = Path(args.model)
        eager, eager_tokens = _eager(model_dir, args.new_tokens, args.runs)
        # First: a peer that cannot run fails the bench before minutes of compiles.
        peer = None if not args.llama_cpp_python else _llama_cpp(
            args.llama_cpp_python, model_dir, args)
        rows = [_run(args.model, r, work, args, eager_tokens) for r in args.recipes]
        peaks = None if args.backend == "qnn" else probe_host(args.threads)
        if peaks is not None:
            _add_decode_roofline(rows, model_dir, peaks, args.new_tokens)
    result = {
        "bench": "llm",
        "model": args.model, "machine": describe_host(),
        "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
        "backend": args.backend, "soc": args.soc if args.backend == "qnn" else None,
        "threads": args.threads, "eager_decode_tokens_per_s": round(eager, 1),
        "host_peaks": None if peaks is None else peaks.to_json(), "rows": rows,
        "llama_cpp": peer,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{args.model}, prompt {PROMPT!r}, {args.new_tokens} new tokens, greedy; "
          f"{result['machine']}, {result['date']}, {args.threads} thread(s); eager HF decode "
          f"{eager:.0f} tok/s")
    if peer is not None:
        print(f"llama.cpp on the GGUF: decode {peer['decode_tokens_per_s']:.0f} tok/s, prefill "
              f"{peer['prefill_tokens_per_s']:.0f} tok/s, TTFT {peer['ttft_ms']:.1f} ms")
    print(render(result))

if __name__ == "__main__":
    main()

"""The peer a CPU user would pick: llama.cpp (llama-cpp-python) greedy on a GGUF file.

Run by `llm_bench.py --llama-cpp-python PYTHON` with an interpreter that has llama-cpp-python
(a benchmark dependency, not the product's: its sdist compiles llama.cpp, see docs/llm.md), on the
same prompt token ids, threads and number of new tokens as our program. Prints one JSON object:
time to first token (the prompt's evaluation), prefill and decode tokens/s (best of `--runs`),
and the generated token ids.

    python bench/llama_cpp_peer.py MODEL.gguf --prompt-ids 1,2,3 --new-tokens 64 --threads 2

With `--serve-logits`, it scores instead (`eval_peer.py` drives it): for each line of stdin, a
JSON object {"ids": [...], "out": PATH}, it evaluates the ids from an empty cache and saves the
logits of every position ([len(ids), vocab], float32) to PATH as .npy, then prints "ok". One
window at a time, so a corpus's logits are never held whole.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def _greedy(llm: Any, prompt: list[int], new_tokens: int) -> tuple[float, float, list[int]]:
    """(seconds for the prompt, seconds for the new tokens after the first, their ids)."""
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    token = int(llm.sample(temp=0.0))  # temp 0: greedy
    prompt_s = time.perf_counter() - t
    out = [token]
    t = time.perf_counter()
    for _ in range(new_tokens - 1):
        llm.eval([token])
        token = int(llm.sample(temp=0.0))
        out.append(token)
    return prompt_s, time.perf_counter() - t, out


def _serve_logits(llm: Any) -> None:
    import sys

    import numpy as np  # pants: no-infer-dep (the bench-only interpreter has it)

    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        ids = [int(t) for t in request["ids"]]
        llm.reset()
        llm.eval(ids)
        np.save(request["out"], np.asarray(llm.scores[: len(ids)], dtype=np.float32))
        print("ok", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf")
    p.add_argument("--prompt-ids", help="comma-separated token ids")
    p.add_argument("--serve-logits", action="store_true",
                   help="score windows read from stdin (see above) instead of generating")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-ctx", type=int, default=512)
    p.add_argument("--runs", type=int, default=3)
    # 1: a llama.cpp built natively here (llama-cpp-python's sdist, AMX / AVX-512 kernels) dies
    # of a general protection fault in libggml-cpu on any batch of more than one token, so the
    # prompt is fed a token at a time: its prefill and TTFT are then not its best; decode, one
    # token per call anyway, is unaffected.
    p.add_argument("--batch", type=int, default=1, help="tokens per llama.cpp batch")
    args = p.parse_args()
    from llama_cpp import Llama  # pants: no-infer-dep (a bench-only interpreter has it)

    if args.serve_logits == (args.prompt_ids is not None):
        p.error("give --prompt-ids (generate) or --serve-logits (score), one of them")
    llm = Llama(model_path=args.gguf, n_ctx=args.n_ctx, n_threads=args.threads,
                n_threads_batch=args.threads, n_batch=args.batch, n_ubatch=args.batch, seed=0,
                logits_all=args.serve_logits, verbose=False)
    if args.serve_logits:
        _serve_logits(llm)
        return
    assert args.prompt_ids is not None
    prompt = [int(t) for t in args.prompt_ids.split(",")]
    runs = [_greedy(llm, prompt, args.new_tokens) for _ in range(args.runs)]
    prompt_s = min(r[0] for r in runs)
    decode_s = min(r[1] for r in runs)
    print(json.dumps({
        "ttft_ms": round(prompt_s * 1000, 1),
        "prefill_tokens_per_s": round(len(prompt) / prompt_s, 1),
        "decode_tokens_per_s": round((args.new_tokens - 1) / decode_s, 1),
        "tokens": runs[0][2],
    }))


if __name__ == "__main__":
    main()

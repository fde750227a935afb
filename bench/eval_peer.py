"""Benchmark: llama.cpp on the same tokens as our programs, scored by the same metrics.

Run after one or more pipeline runs of SmolLM2 (`qnn-pipeline --model smollm2-135m ... --out
OUT`), with an interpreter that has llama-cpp-python (a bench dependency; its sdist compiles
llama.cpp, see docs/llm.md):

    ./pants run bench/eval_peer.py -- --run out/8da4w --run out/16a4w_block \
        --llama-cpp-python /path/to/python --tokens 20480 --json eval_peer.json

The shipped corpus (qnn_infer/evaluation/data) is cut into the evaluation's windows with the
model's tokenizer; per window, the float model of the first run (its prepare artifact) is the
reference and every other model is compared with it by
`qnn_common.numerics.lm_metrics.score_window`: each run's fake-quantized model and program, and
llama.cpp on the GGUF file the model comes from (`llama_cpp_peer.py --serve-logits`, one window at a
time). The GGUF is Q4_1, and our float model is that GGUF dequantized: so llama.cpp's row is the
cost of its own arithmetic (Q8 activations against Q4_1 weights), ours the cost of the recipe's.
Prints one table; the figures are a sample of the corpus (`--tokens`), the intervals say how far
they can move.

`--weights-only` adds each run's fake-quantized model with its activations left in float
(`qnn_quant.fused_qdq.float_activations`): what the recipe's weights alone cost, so a gap is
told apart into weights and activations. `--no-program` (or a run stopped after quantize) scores
no program: the HTP emulator's would take hours over a corpus the references read in minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
from host import describe_host
from tables import render

from qnn_common.config import Stage
from qnn_common.numerics.lm_metrics import WindowScore, score_window, summarize_windows
from qnn_infer.evaluation.corpus import MAX_WINDOW, windows
from qnn_infer.evaluation.data import shipped
from qnn_infer.evaluation.lm import logits
from qnn_infer.evaluation.program import artifact_text, program_lm
from qnn_pipeline.eval_cli import run_artifacts
from qnn_prepare.causal_lm.smollm2 import gguf_path
from qnn_quant.lm_steps import artifact_lm

PEER = Path(__file__).with_name("llama_cpp_peer.py")


def _artifacts(run: Path) -> dict[str, Path]:
    """The run's artifact per stage, from its summary.json; from a run stopped before it wrote
    one (killed during --eval), each stage's newest sealed `STAGE-*` directory."""
    if (run / "summary.json").is_file():
        return {stage.value: path for stage, path in run_artifacts(run).items()}
    found: dict[str, Path] = {}
    for stage in Stage:
        sealed = [d for d in run.glob(f"{stage.value}-*") if (d / "manifest.json").is_file()]
        if sealed:
            found[stage.value] = max(sealed, key=lambda d: d.stat().st_mtime)
    if Stage.PREPARE.value not in found:
        raise SystemExit(f"{run}: no summary.json and no sealed prepare-* artifact")
    return found


class _Peer:
    """llama.cpp in its own interpreter, answering one window's logits per request."""

    def __init__(self, python: str, threads: int, n_ctx: int) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="eval-peer-")
        self.proc = subprocess.Popen(
            [python, str(PEER), str(gguf_path()), "--serve-logits", "--threads", str(threads),
             "--n-ctx", str(n_ctx), "--batch", str(n_ctx)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self._expect("ready")

    def _expect(self, word: str) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != word:
            raise SystemExit(f"llama.cpp peer: expected {word!r}, got {line!r} "
                             f"(exit {self.proc.poll()})")

    def logits(self, ids: list[int]) -> np.ndarray:
        out = Path(self.dir.name) / "window.npy"
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"ids": ids, "out": str(out)}) + "\n")
        self.proc.stdin.flush()
        self._expect("ok")
        return np.asarray(np.load(out), dtype=np.float32)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.dir.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", type=Path, action="append", required=True,
                   help="a pipeline run's --out directory (repeat; the first one's float model "
                   "is the reference)")
    p.add_argument("--llama-cpp-python", metavar="PYTHON",
                   help="an interpreter with llama-cpp-python: add llama.cpp's row")
    p.add_argument("--weights-only", action="store_true",
                   help="add each run's fake-quantized model with its activations in float: "
                   "what the recipe's weights alone cost")
    p.add_argument("--no-program", action="store_true",
                   help="score no program (a slow one: the HTP emulator)")
    p.add_argument("--tokens", type=int, default=20480, help="corpus tokens to score")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args()

    runs = {run: _artifacts(run) for run in args.run}
    first = runs[args.run[0]]
    reference = artifact_lm(first[Stage.PREPARE.value], "fp32")
    candidates: dict[str, Callable[[list[int]], np.ndarray]] = {}
    closers: list[Callable[[], None]] = []
    for run, arts in runs.items():
        if Stage.QUANTIZE.value in arts:
            fake = artifact_lm(arts[Stage.QUANTIZE.value], "fake_quant")
            candidates[f"{run.name}: fake quant"] = partial(logits, fake)
            if args.weights_only:
                weights = artifact_lm(arts[Stage.QUANTIZE.value], "weights only",
                                      weights_only=True)
                candidates[f"{run.name}: fake quant, float activations"] = partial(
                    logits, weights)
        if args.no_program or Stage.COMPILE.value not in arts:
            continue
        program, pte = program_lm(arts[Stage.COMPILE.value])
        closers.append(pte.close)
        candidates[f"{run.name}: program"] = partial(logits, program)
    length = min(MAX_WINDOW, reference.spec.context)
    if args.llama_cpp_python:
        peer = _Peer(args.llama_cpp_python, args.threads, length)
        closers.append(peer.close)
        candidates["llama.cpp Q4_1"] = peer.logits
    text = artifact_text(first[Stage.PREPARE.value], reference)
    cut = windows(shipped().documents, text.encode, length, args.tokens)
    scores: dict[str, list[WindowScore]] = {name: [] for name in candidates}
    seconds = dict.fromkeys(candidates, 0.0)
    try:
        for number, ids in enumerate(cut, 1):
            ref = logits(reference, ids)
            for name, score in candidates.items():
                t = time.perf_counter()
                theirs = score(ids)
                seconds[name] += time.perf_counter() - t
                scores[name].append(score_window(ref, theirs, ids))
            print(f"window {number}/{len(cut)}", flush=True)
    finally:
        for close in closers:
            close()
    result = {
        "bench": "eval_peer", "host": describe_host(), "reference": args.run[0].name,
        "tokens": sum(len(w) for w in cut), "windows": len(cut), "window": length,
        "rows": [{"model": name, "seconds": round(seconds[name], 1),
                  "figures": summarize_windows(scored).to_json()}
                 for name, scored in scores.items()],
    }
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Where a PT2E-quantized causal LM loses accuracy: one class of quantized activation at a time
left in float.

Loads quantize artifacts' prefill and decode (the fake-quant model the quantize stage judges,
`qnn_quant.fused_qdq.reference_module`), groups their activation fake-quantize ops by the op
whose output they round (an `add`, a `linear`, the RMSNorm, the KV cache's inputs, ...), and
for each group runs the held-out eval texts teacher-forced with that group's rounding removed
in both methods: perplexity over the artifact's own fp32 reference, logits SQNR and argmax
agreement against it. Weights stay quantized throughout, so "all activations" is what the
weights alone cost. A group whose removal recovers much of the gap is where the recipe loses.

`--draws N` also reruns the whole fake-quant model N times with its embeddings jittered by 1e-4
before their rounding: how far one perplexity figure moves when nothing but the rounding noise
does.

    qnn-pipeline --model smollm2-135m --backend qnn --soc SM8650 --recipe 16a8w \\
        --max-seq-len 256 --prompt hi --stop-after quantize --out /tmp/q16
    PYTHONPATH=src/python:bench python bench/qdq_sensitivity.py /tmp/q16/quantize-* \\
        --json /tmp/sensitivity.json
"""

from __future__ import annotations

import argparse
import collections
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from qnn_common.causal_lm.steps import method_steps, teacher_forced_logits
from qnn_common.causal_lm.tables import rope_of, sink_of
from qnn_common.numerics.lm_metrics import perplexity
from qnn_common.numerics.metrics import logits_accuracy
from qnn_common.sealing import load_manifest
from qnn_common.stages import EVAL_INPUTS, REFERENCE_FP32, llm_spec_of, program_files
from qnn_common.torchio.programs import load_methods
from qnn_common.torchio.samples import load_samples
from qnn_quant.fused_qdq import reference_module
from qnn_quant.method_modules import module_runner

_FAKE_QUANT = torch.fake_quantize_per_tensor_affine
JITTER = 1e-4


def group_of(node: torch.fx.Node) -> str:
    """The class of a fake-quantize node: the op whose output it rounds (a graph input by
    what it is: the KV cache, the mask, the rotary table)."""
    source = node.args[0]
    assert isinstance(source, torch.fx.Node)
    if source.op == "placeholder":
        for kind in ("cache", "mask", "cos", "sin"):
            if kind in source.name:
                return f"input {kind}"
        return f"input {source.name}"
    if source.target is _FAKE_QUANT:
        return "requantize"  # a second grid for one consumer (QNN's matmul inputs)
    name = str(source.target)
    return name.split(".")[-2] if name.count(".") >= 2 else name


def _jittered(x: torch.Tensor, *qparams: Any) -> torch.Tensor:
    return _FAKE_QUANT(x + JITTER * torch.randn_like(x), *qparams)


def sensitivity(artifact: Path, draws: int, groups: list[str] | None) -> list[dict[str, Any]]:
    """The rows of one quantize artifact: the fake-quant model as it is, its jittered draws,
    then each group (or only `groups`) left in float."""
    manifest = load_manifest(artifact)
    spec = llm_spec_of(artifact, manifest)
    if spec is None:
        raise SystemExit(f"{artifact} holds no causal LM")
    rope, sink = rope_of(artifact, manifest), sink_of(artifact, manifest)
    files = program_files(artifact, manifest)
    modules = {m: reference_module(ep) for m, ep in
               load_methods({m: artifact / f for m, f in files.items()}).items()}
    texts = [s[0] for s in load_samples(artifact / EVAL_INPUTS)]
    reference = [s[0].numpy() for s in load_samples(artifact / REFERENCE_FP32)]
    fp32 = perplexity(reference, [t.numpy() for t in texts])
    program = "attention sink" if spec.sink_token_id is not None else "first token computed"
    print(f"{artifact}: {program}, fp32 perplexity {fp32:.3f} over "
          f"{sum(len(t) - 1 for t in texts)} tokens", flush=True)

    def measure(name: str, ops: int) -> dict[str, Any]:
        for gm in modules.values():
            gm.recompile()
        logits = [x.numpy() for x in teacher_forced_logits(
            *method_steps(spec, module_runner(modules, spec), rope, sink), texts, spec)]
        value = perplexity(logits, [t.numpy() for t in texts])
        accuracy = logits_accuracy(reference, logits)
        row = {"program": program, "float": name, "ops": ops, "fp32": round(fp32, 3),
               "perplexity": round(value, 3), "vs_fp32_percent": round(100 * (value / fp32 - 1), 2),
               "sqnr_db": accuracy["sqnr_db"], "argmax": accuracy["argmax_agreement"]}
        print(f"  {name:22s} {ops:5d} ops  perplexity {value:.3f} "
              f"({row['vs_fp32_percent']:+.2f} %)  {row['sqnr_db']:.2f} dB  "
              f"argmax {row['argmax']:.3f}", flush=True)
        return row

    def swapped(nodes: list[torch.fx.Node], name: str, swap: Callable[[torch.fx.Node], None],
                ops: int) -> dict[str, Any]:
        saved = [(n, n.target, n.args) for n in nodes]
        for n in nodes:
            swap(n)
        try:
            return measure(name, ops)
        finally:
            for n, target, node_args in saved:
                n.target, n.args = target, node_args

    def unrounded(n: torch.fx.Node) -> None:  # an identity: the value passes unrounded
        n.target, n.args = torch.ops.aten.alias.default, (n.args[0],)

    def jittered(n: torch.fx.Node) -> None:
        n.target = _jittered

    nodes = [n for gm in modules.values() for n in gm.graph.nodes
             if n.op == "call_function" and n.target is _FAKE_QUANT]
    by_group: dict[str, list[torch.fx.Node]] = collections.defaultdict(list)
    for n in nodes:
        by_group[group_of(n)].append(n)
    rows = [measure("none", 0)]
    for draw in range(1, draws + 1):
        torch.manual_seed(draw)
        rows.append(swapped(by_group["embedding"], f"none, jitter {draw}", jittered, 0))
    for name, members in [("all activations", nodes), *sorted(by_group.items())]:
        if groups is None or name in groups:
            rows.append(swapped(members, name, unrounded, len(members)))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifacts", type=Path, nargs="+", help="quantize artifacts of causal LMs")
    p.add_argument("--draws", type=int, default=0,
                   help="reruns with the embeddings jittered (the spread of one figure)")
    p.add_argument("--groups", nargs="*",
                   help="only these groups (as the table names them; 'all activations' too)")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()
    rows = [row for a in args.artifacts for row in sensitivity(a, args.draws, args.groups)]
    if args.json:
        args.json.write_text(json.dumps({"bench": "qdq_sensitivity", "rows": rows}, indent=1)
                             + "\n")


if __name__ == "__main__":
    main()

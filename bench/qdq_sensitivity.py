"""Where a PT2E-quantized causal LM loses its perplexity: one class of quantized activation at a
time left in float.

Loads a quantize artifact's prefill and decode (the fake-quant model the quantize stage judges,
`qnn_quant.fused_qdq.reference_module`), groups its activation fake-quantize ops by the op whose
output they round (an `add`, a `linear`, the RMSNorm, the KV cache's inputs, ...), and for each
group runs the held-out eval texts teacher-forced with that group's rounding removed in both
methods. A group whose removal recovers much of the gap to fp32 is where the recipe loses.
Weights stay quantized throughout.

    qnn-pipeline --model smollm2-135m --backend qnn --soc SM8650 --recipe 16a8w \\
        --max-seq-len 256 --prompt hi --stop-after quantize --out /tmp/q16
    PYTHONPATH=src/python:bench python bench/qdq_sensitivity.py /tmp/q16/quantize
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path
from typing import Any

import torch

from qnn_common.llm import method_steps, teacher_forced_logits
from qnn_common.metrics import logits_accuracy, perplexity
from qnn_common.sealing import load_manifest
from qnn_common.stages import (
    EVAL_INPUTS,
    REFERENCE_FP32,
    llm_spec_of,
    program_files,
    rope_of,
    sink_of,
)
from qnn_common.torchio.programs import load_methods
from qnn_common.torchio.samples import load_samples
from qnn_quant.fused_qdq import reference_module
from qnn_quant.methods import module_runner

_FAKE_QUANT = torch.fake_quantize_per_tensor_affine


def group_of(node: torch.fx.Node) -> str:
    """The class of a fake-quantize node: the op whose output it rounds (a graph input by
    its kind: the KV cache, the mask, the rotary table)."""
    source = node.args[0]
    assert isinstance(source, torch.fx.Node)
    if source.op == "placeholder":
        name = source.name
        for kind in ("k_", "v_", "cache", "mask", "cos", "sin"):
            if kind in name:
                return f"input:{kind.strip('_')}"
        return f"input:{name}"
    if source.op == "get_attr":
        return "constant"
    return str(source.target).split(".")[-2] if "." in str(source.target) else str(
        source.target)


def fake_quant_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is _FAKE_QUANT]


def _jittered(x: torch.Tensor, *qparams: Any) -> torch.Tensor:
    return _FAKE_QUANT(x + 1e-4 * torch.randn_like(x), *qparams)


def every_node(modules: dict[str, torch.fx.GraphModule]) -> list[torch.fx.Node]:
    return [n for gm in modules.values() for n in fake_quant_nodes(gm)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact", type=Path, help="a quantize artifact of a causal LM")
    p.add_argument("--by-layer", action="store_true",
                   help="also leave each decoder layer's activations in float, one at a time")
    p.add_argument("--draws", type=int, default=0,
                   help="also run the fake-quant model this many times with its embeddings "
                        "jittered by 1e-4 before their rounding: the spread of one figure")
    p.add_argument("--groups", nargs="*", help="only these groups (as the table names them)")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()

    manifest = load_manifest(args.artifact)
    spec = llm_spec_of(args.artifact, manifest)
    assert spec is not None, "not a causal LM artifact"
    rope, sink = rope_of(args.artifact, manifest), sink_of(args.artifact, manifest)
    files = program_files(args.artifact, manifest)
    programs = load_methods({m: args.artifact / f for m, f in files.items()})
    modules = {m: reference_module(ep) for m, ep in programs.items()}
    texts = [s[0] for s in load_samples(args.artifact / EVAL_INPUTS)]
    reference = [s[0].numpy() for s in load_samples(args.artifact / REFERENCE_FP32)]
    fp32 = perplexity(reference, [t.numpy() for t in texts])

    def measure(name: str, ops: int) -> dict[str, Any]:
        for gm in modules.values():
            gm.recompile()
        logits = [x.numpy() for x in teacher_forced_logits(
            *method_steps(spec, module_runner(modules, spec), rope, sink), texts, spec)]
        value = perplexity(logits, [t.numpy() for t in texts])
        accuracy = logits_accuracy(reference, logits)
        row = {"float": name, "ops": ops, "perplexity": round(value, 3),
               "vs_fp32_percent": round(100 * (value / fp32 - 1), 2),
               "sqnr_db": accuracy["sqnr_db"], "argmax": accuracy["argmax_agreement"]}
        print(f"{name:24s} {ops:5d} ops  ppl {value:.3f} ({row['vs_fp32_percent']:+.2f} %)  "
              f"{row['sqnr_db']:.2f} dB  argmax {row['argmax']:.3f}", flush=True)
        return row

    groups: dict[str, list[torch.fx.Node]] = collections.defaultdict(list)
    layers: dict[str, list[torch.fx.Node]] = collections.defaultdict(list)
    for gm in modules.values():
        for node in fake_quant_nodes(gm):
            groups[group_of(node)].append(node)
            stack = node.meta.get("nn_module_stack") or {}
            path = next(reversed(stack.values()))[0] if stack else ""
            parts = str(path).split(".")
            if "layers" in parts:
                layers["layer " + parts[parts.index("layers") + 1]].append(node)

    def without(name: str, nodes: list[torch.fx.Node]) -> dict[str, Any]:
        saved = [(n, n.target, n.args) for n in nodes]
        for n in nodes:  # an identity in the fake quant's place: the value passes unrounded
            n.target, n.args = torch.ops.aten.alias.default, (n.args[0],)
        try:
            return measure(name, len(nodes))
        finally:
            for n, target, node_args in saved:
                n.target, n.args = target, node_args

    print(f"fp32 perplexity {fp32:.3f}", flush=True)
    rows: list[dict[str, Any]] = [measure("none", 0)]
    embeddings = [n for n in every_node(modules) if group_of(n) == "embedding"]
    for draw in range(1, args.draws + 1):
        torch.manual_seed(draw)
        for n in embeddings:
            n.target = _jittered
        try:
            rows.append(measure(f"none, jitter {draw}", 0))
        finally:
            for n in embeddings:
                n.target = _FAKE_QUANT
    candidates = [("all activations", every_node(modules)), *sorted(groups.items())]
    if args.by_layer:
        candidates += sorted(layers.items(), key=lambda kv: int(kv[0].split()[1]))
    for name, nodes in candidates:
        if args.groups and name not in args.groups:
            continue
        rows.append(without(name, nodes))
    if args.json:
        args.json.write_text(json.dumps({"fp32": round(fp32, 4), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

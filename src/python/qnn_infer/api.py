"""The infer stage as a library call: run a .pte, judge it against its references, time it."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

import qnn_infer
from qnn_common.config import AccuracyGates, InferConfig, Stage
from qnn_common.errors import ConfigValidationError, PipelineError
from qnn_common.manifest import (
    Manifest,
    begin_artifact,
    cache_key,
    code_version,
    load_manifest,
    manifest_digest,
    sha256_file,
    write_manifest,
)
from qnn_common.metrics import cosine, max_abs_error, sqnr_db
from qnn_common.recipes import Recipe
from qnn_common.stages import (
    ETDUMP,
    EVAL_INPUTS,
    OUTPUTS,
    PTE,
    REFERENCE_FAKE_QUANT,
    REFERENCE_FP32,
    InferInput,
    InferOutput,
    compiled_for,
)
from qnn_common.tensorio import Sample, load_samples, save_samples
from qnn_infer.device import device_runner
from qnn_infer.measure import measure_latency
from qnn_infer.runner import HostRunner, Runner
from qnn_infer.runtimes import delegates_in, prepare_runtime

PACKAGE = "qnn-infer"
log = logging.getLogger(__name__)


def _digests(inp: InferInput) -> dict[str, str]:
    if inp.source.is_dir():
        digests = {"compile": manifest_digest(inp.source)}
    else:
        digests = {"pte": sha256_file(inp.source)}
    if inp.config.inputs_file is not None:
        digests["inputs_file"] = sha256_file(inp.config.inputs_file)
    return digests


def infer_cache_key(inp: InferInput) -> str:
    return cache_key(Stage.INFER, inp.config, _digests(inp), code_version(qnn_infer))


def compare(reference: list[Sample], actual: list[Sample]) -> dict[str, Any]:
    """SQNR, cosine and max abs error per output (over all samples) and overall."""
    per_output = []
    for i in range(len(reference[0])):
        ref = np.concatenate([r[i].detach().double().numpy().ravel() for r in reference])
        got = np.concatenate([a[i].detach().double().numpy().ravel() for a in actual])
        per_output.append(
            {"output": i, "sqnr_db": sqnr_db(ref, got), "cosine": cosine(ref, got),
             "max_abs_error": max_abs_error(ref, got)}
        )
    return {
        "sqnr_db": min(o["sqnr_db"] for o in per_output),
        "cosine": min(o["cosine"] for o in per_output),
        "max_abs_error": max(o["max_abs_error"] for o in per_output),
        "per_output": per_output,
    }


# Each gate: its field, the comparison it reads ("vs_fp32" / "vs_fake_quant"), the metric, and the
# qnn-infer / qnn-pipeline flag that sets it.
_GATES: tuple[tuple[str, str, str, str], ...] = (
    ("min_sqnr_db_vs_fp32", "vs_fp32", "sqnr_db", "--min-sqnr-db"),
    ("min_cosine_vs_fp32", "vs_fp32", "cosine", "--min-cosine"),
    ("min_sqnr_db_vs_fake_quant", "vs_fake_quant", "sqnr_db", "--min-sqnr-db-vs-fake-quant"),
    ("min_cosine_vs_fake_quant", "vs_fake_quant", "cosine", "--min-cosine-vs-fake-quant"),
)
GATE_FLAGS: dict[str, str] = {name: flag for name, _, _, flag in _GATES}


class AccuracyGateError(PipelineError):
    """The program ran, but its outputs are less accurate than the infer gates allow.

    The infer artifact is written and sealed anyway (its outputs are the evidence): `artifact_dir`
    and `manifest` point at it, and `failures` lists each gate missed with the measured value.
    """

    stage = Stage.INFER

    def __init__(self, artifact_dir: Path, manifest: Manifest, failures: list[dict[str, Any]],
                 recipe: str | None) -> None:
        self.artifact_dir = artifact_dir
        self.manifest = manifest
        self.failures = failures
        what = f"this {recipe} program" if recipe else "this program"
        missed = "; ".join(
            f"{_LABELS[f['metric']]} {f['comparison'].replace('_', ' ')} "
            f"{_fmt(f['value'], f['metric'])} < {_fmt(f['gate'], f['metric'])} ({f['field']})"
            for f in failures
        )
        relaxed = [(f["field"], _fmt(_relaxed(f["metric"], f["value"]), "")) for f in failures]
        flags = " ".join(f"{GATE_FLAGS[name]} {value}" for name, value in relaxed)
        toml = ", ".join(f"{name} = {value}" for name, value in relaxed)
        super().__init__(
            f"infer: the outputs of {what} are below the accuracy gates: {missed}. The outputs "
            f"are kept in {artifact_dir} for inspection. If this accuracy is expected, relax "
            f"the gate ({flags}, or under [infer] in the TOML file: {toml}), or pass "
            "--no-accuracy-gates to report without checking"
        )


_LABELS = {"sqnr_db": "SQNR", "cosine": "cosine"}


def _fmt(value: float, metric: str) -> str:
    text = "inf" if value == math.inf else "-inf" if value == -math.inf else f"{value:.4g}"
    return text + (" dB" if metric == "sqnr_db" else "")


def _relaxed(metric: str, value: float) -> float:
    """A gate just below the measured value, to suggest in the error message."""
    if not math.isfinite(value):
        return -math.inf if metric == "sqnr_db" else -1.0
    if metric == "sqnr_db":
        return math.floor(value)
    return max(-1.0, math.floor(value * 1000) / 1000)


def judge_accuracy(
    accuracy: dict[str, Any], gates: AccuracyGates, recipe: Recipe | None = None
) -> dict[str, Any]:
    """The gate verdict recorded in the infer manifest (`metrics.accuracy_gates`).

    `ok` is True when every gate with a reference passed, False when one failed, and None when
    there was nothing to judge (no reference for these inputs, or no gate for what there is).
    """
    failures: list[dict[str, Any]] = []
    checked = 0
    for name, comparison, metric, _ in _GATES:
        gate = getattr(gates, name)
        if gate is None or comparison not in accuracy:
            continue
        checked += 1
        value = float(accuracy[comparison][metric])
        # NaN (nothing comparable) fails: a gate that cannot be checked must not read as passed.
        if not value >= gate:
            failures.append({"field": name, "comparison": comparison, "metric": metric,
                             "value": value, "gate": gate})
    return {
        "ok": None if checked == 0 else not failures,
        "recipe": None if recipe is None else recipe.value,
        "gates": dataclasses.asdict(gates),
        "failures": failures,
    }


def check_accuracy_gates(artifact_dir: Path, manifest: Manifest) -> None:
    """Raise AccuracyGateError if the infer artifact's recorded verdict is a failure.

    Run on every infer result, fresh or cached: a cached artifact that failed its gates (same
    program, inputs and gates) fails again rather than passing on the second run.
    """
    verdict = manifest.metrics.get("accuracy_gates") or {}
    if verdict.get("ok") is False:
        failures = [
            {**f, "value": float(f["value"]), "gate": float(f["gate"])}  # "inf" strings in JSON
            for f in verdict.get("failures", [])
        ]
        raise AccuracyGateError(artifact_dir, manifest, failures, verdict.get("recipe"))


def run_infer(inp: InferInput) -> InferOutput:
    """Run the program on the artifact's eval inputs (or `inputs_file`), compare and time it."""
    cfg: InferConfig = inp.config
    if inp.source.is_dir():
        upstream = load_manifest(inp.source, expect_stage=Stage.COMPILE)
        pte = inp.source / PTE
        have = {f.path for f in upstream.files}
    else:
        upstream, pte, have = None, inp.source, set()
    eval_inputs = load_samples(inp.source / EVAL_INPUTS) if EVAL_INPUTS in have else None
    # References were computed on the eval inputs: they judge the program only on those.
    references_apply = cfg.inputs_file is None and eval_inputs is not None
    if cfg.inputs_file is not None:
        inputs = load_samples(cfg.inputs_file, like=None if eval_inputs is None else eval_inputs[0])
    elif eval_inputs is not None:
        inputs = eval_inputs
    else:
        raise ConfigValidationError(
            "infer.inputs_file", None,
            f"{pte} comes without evaluation inputs; pass --inputs FILE.pt "
            "(a tensor, a tuple of tensors, or a list of those, saved with torch.save)",
        )

    arch = None
    recipe: Recipe | None = None  # unknown for a bare .pte: only gates set explicitly apply
    if upstream is not None:
        target, recipe = compiled_for(inp.source, upstream)
        backends = {target.backend}
        arch = target.soc.htp_arch if target.soc is not None else None
    else:
        backends = delegates_in(pte)
    runtime = prepare_runtime(backends)

    out = begin_artifact(inp.out_dir)
    etdump = out / ETDUMP if cfg.etdump else None
    runner: Runner
    if cfg.device is not None:
        runner = device_runner(pte, cfg, backends, runtime, arch)
    else:
        # Event tracing is switched on at load time; it also traces (and slows) the timed runs.
        runner = HostRunner(pte, example_inputs=inputs[0], etdump_path=etdump)
    t = time.perf_counter()
    outputs = [runner.run(sample) for sample in inputs]
    run_s = time.perf_counter() - t
    latency = measure_latency(runner, inputs[0], warmup=cfg.warmup, runs=cfg.runs)
    log.info("ran %d sample(s); p50 %.3f ms, p90 %.3f ms", len(inputs),
             latency["p50_ms"], latency["p90_ms"])
    if etdump is not None and isinstance(runner, HostRunner):
        runner.write_etdump(etdump)
    save_samples(out / OUTPUTS, outputs)

    accuracy: dict[str, Any] = {}
    if references_apply:
        for key, name in (("vs_fp32", REFERENCE_FP32), ("vs_fake_quant", REFERENCE_FAKE_QUANT)):
            if name in have:
                accuracy[key] = compare(load_samples(inp.source / name), outputs)
    verdict = judge_accuracy(accuracy, cfg.gates_for(recipe), recipe)
    digests = _digests(inp)
    files = [OUTPUTS] + ([ETDUMP] if etdump is not None else [])
    manifest = write_manifest(
        out,
        stage=Stage.INFER,
        package=PACKAGE,
        package_version=qnn_infer.__version__,
        config=cfg,
        inputs=digests,
        files=files,
        cache_key=cache_key(Stage.INFER, cfg, digests, code_version(qnn_infer)),
        timings={"run_s": round(run_s, 3)},
        extra_tools=runtime.tools,
        metrics={
            "model": upstream.metrics.get("model") if upstream else Path(pte).name,
            "runner": runner.name,
            **({"runtime": runtime.record} if runtime.record else {}),
            "samples": len(inputs),
            "latency_ms": {k.removesuffix("_ms"): v for k, v in latency.items()},
            "accuracy": accuracy,
            "accuracy_gates": verdict,
        },
    )
    # After sealing: the outputs of a run below the gates are the evidence of what went wrong.
    check_accuracy_gates(out, manifest)
    return InferOutput(out, manifest)


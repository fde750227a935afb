"""Infer for a one-method program: run it on the artifact's eval inputs (or an inputs file),
compare its outputs with the fp32 and fake-quant references, time it; on the host or on a device
over adb."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from qnn_common.artifact import Artifact
from qnn_common.config import InferConfig
from qnn_common.errors import ConfigValidationError
from qnn_common.manifest import Manifest
from qnn_common.numerics.metrics import compare_samples
from qnn_common.recipes import Recipe
from qnn_common.reports import InferReport
from qnn_common.stages import (
    ETDUMP,
    EVAL_INPUTS,
    OUTPUTS,
    REFERENCE_FAKE_QUANT,
    REFERENCE_FP32,
    InferInput,
    compiled_for,
)
from qnn_common.store.artifact_dir import begin_artifact
from qnn_common.torchio.samples import load_inputs, load_samples, save_samples
from qnn_infer.device import device_runner
from qnn_infer.gate_check import judge_accuracy
from qnn_infer.isolation import Rehearsal, Step, rehearse_unless_compiled_here
from qnn_infer.measure import measure_latency
from qnn_infer.profile import PROFILE_JSON, PROFILE_MD, write_profile
from qnn_infer.profile import summary as profile_summary
from qnn_infer.program_check import check_program_matches
from qnn_infer.pte import check_pte_header
from qnn_infer.runner import HostRunner, Runner
from qnn_infer.runtimes import delegates_in, prepare_runtime, set_cpu_threads
from qnn_infer.sealing import seal

log = logging.getLogger(__name__)


def run(
    inp: InferInput, upstream: Manifest | None, pte: Path, have: set[str]
) -> Artifact:
    """Run the program on the artifact's eval inputs (or `inputs_file`), compare and time it."""
    cfg: InferConfig = inp.config
    if cfg.generation is not None:
        # Not silently dropped: a run that ignored the prompt would pass for one that generated.
        raise ConfigValidationError(
            "infer.generation", {"prompt": cfg.generation.prompt[:40]},
            f"{inp.source.path} is not a causal-LM program with a KV cache, so there is nothing to "
            "generate with; compile one from a KV-cache export (qnn-prepare --kv-cache), or drop "
            "--prompt and the other generation settings",
        )
    eval_inputs = load_inputs(inp.source.path / EVAL_INPUTS) if EVAL_INPUTS in have else None
    # References were computed on the eval inputs: they judge the program only on those.
    references_apply = cfg.inputs_file is None and eval_inputs is not None
    if cfg.inputs_file is not None:
        inputs = load_inputs(cfg.inputs_file, like=None if eval_inputs is None else eval_inputs[0])
    elif eval_inputs is not None:
        inputs = eval_inputs
    else:
        raise ConfigValidationError(
            "infer.inputs_file", None,
            f"{pte} comes without evaluation inputs; pass --inputs FILE.pt "
            "(a tensor, a tuple of tensors, or a list of those, saved with torch.save; "
            "structured inputs as {'args': (...), 'kwargs': {...}} per sample)",
        )
    # The program takes the pytree leaves of each sample's (args, kwargs), in order, constants
    # included (torch.export keeps them as inputs it then ignores): see ModelInputs.leaves.
    flat = [s.leaves() for s in inputs]
    constants = [v for v in flat[0] if not isinstance(v, torch.Tensor)]
    if cfg.device is not None and constants:
        # The device runner pushes every input as a raw tensor file; constants have no such form.
        raise ConfigValidationError(
            "infer.device", cfg.device,
            f"this program also takes non-tensor inputs ({', '.join(map(repr, constants))}: "
            "constants torch.export baked in), which the adb runner cannot pass; run it on the "
            "host (drop --device)",
        )

    arch = None
    recipe: Recipe | None = None  # unknown for a bare .pte: only gates set explicitly apply
    if upstream is not None:
        target, recipe = compiled_for(inp.source.path, upstream)
        # What the summary will report is what runs.
        check_program_matches(inp.source.path, upstream)
        backends = {target.backend}
        arch = target.soc.htp_arch if target.soc is not None else None
    else:
        backends = delegates_in(pte)
    runtime = prepare_runtime(backends)
    threads: int | None = None  # the host's CPU threads; a device run uses the device's own
    if cfg.device is None:
        threads = set_cpu_threads(cfg.threads)
    # Before anything is written: a program that aborts the runtime is one error line.
    check_pte_header(pte)
    rehearse_unless_compiled_here(
        pte, inp.source.pte_sha256,
        _loading(pte) if cfg.device is not None else _running(pte, flat))

    out = begin_artifact(inp.out_dir, inputs=[inp.source.path, cfg.inputs_file])
    etdump = out / ETDUMP if cfg.etdump else None
    host: HostRunner | None = None
    runner: Runner
    if cfg.device is not None:  # InferConfig refuses etdump with a device
        runner = device_runner(pte, cfg, backends, runtime, arch)
    else:
        # Event tracing is switched on at load time; it also traces (and slows) the timed runs.
        runner = host = HostRunner(pte, example_inputs=flat[0], etdump_path=etdump)
    t = time.perf_counter()
    outputs = [runner.run(sample) for sample in flat]
    run_s = time.perf_counter() - t
    latency = measure_latency(runner, flat[0], warmup=cfg.warmup, runs=cfg.runs)
    log.info("ran %d sample(s); p50 %.3f ms, p90 %.3f ms", len(inputs),
             latency["p50_ms"], latency["p90_ms"])
    profile_files: list[str] = []
    profiled: dict[str, Any] | None = None
    if etdump is not None and host is not None:
        host.write_etdump(etdump)
        if cfg.profile:
            profile = write_profile(etdump, out, Path(pte).name)
            profile_files = [PROFILE_MD, PROFILE_JSON]
            profiled = profile_summary(profile)
            log.info("profile: %s (Method::execute %.3f ms per traced run)",
                     out / PROFILE_MD, profile.execute_ms)
    save_samples(out / OUTPUTS, outputs)

    accuracy: dict[str, Any] = {}
    if references_apply:
        for key, name in (("vs_fp32", REFERENCE_FP32), ("vs_fake_quant", REFERENCE_FAKE_QUANT)):
            if name in have:
                accuracy[key] = compare_samples(load_samples(inp.source.path / name), outputs)
    verdict = judge_accuracy(accuracy, cfg.gates_for(recipe), recipe)
    files = [OUTPUTS] + ([ETDUMP] if etdump is not None else []) + profile_files
    manifest = seal(
        out, inp, files, {"run_s": run_s}, extra_tools=runtime.tools,
        program=upstream.program if upstream is not None else None,
        metrics=InferReport(
            model=upstream.metrics.get("model") if upstream else Path(pte).name,
            # A bare .pte records nothing else about itself: the backends its delegates are for.
            delegates=None if upstream else sorted(b.value for b in backends),
            runner=runner.name,
            threads=threads,
            runtime=runtime.record or None,
            samples=len(inputs),
            latency_ms={k.removesuffix("_ms"): v for k, v in latency.items()},
            accuracy=accuracy,
            accuracy_gates=verdict,
            profile=profiled,
        ).to_metrics(),
    )
    # A run below the gates is sealed too (its outputs are the evidence); the verdict is in the
    # manifest, and the CLIs turn a failure into an exit code (gate_check.gate_failure).
    return Artifact(inp.out_dir, manifest)


# What the runtime does first with a program this process did not compile, rehearsed in a child
# (qnn_infer.isolation): the same loads and the same inputs as the run that follows.


def _running(pte: Path, samples: Sequence[Sequence[Any]]) -> Rehearsal:
    def rehearsal(step: Step) -> None:
        step("loading it")
        runner = HostRunner(pte, example_inputs=samples[0])
        for i, sample in enumerate(samples):
            step(f"running it on sample {i}")
            runner.run(tuple(sample))

    return rehearsal


def _loading(pte: Path) -> Rehearsal:
    """A device run: the host only loads the program, for its output metadata."""

    def rehearsal(step: Step) -> None:
        from executorch.runtime import Runtime

        step("loading it")
        Runtime.get().load_program(pte).metadata("forward")

    return rehearsal

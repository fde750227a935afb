"""The prepare stage as a library call: model spec in, sealed artifact directory out."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

import qnn_prepare
from qnn_common.config import PrepareConfig, Stage
from qnn_common.manifest import (
    Manifest,
    atomic_write_bytes,
    begin_artifact,
    cache_key,
    code_version,
    seal_stage,
    sha256_file,
)
from qnn_common.stages import (
    CALIBRATION,
    EVAL_INPUTS,
    PROGRAM,
    REFERENCE_FP32,
    ROPE_TABLE,
    TOKENIZER_DIR,
    PrepareInput,
    PrepareOutput,
    method_program,
)
from qnn_common.tensorio import (
    ModelInputs,
    Sample,
    flatten_outputs,
    save_program,
    save_samples,
)
from qnn_prepare.calibration import calibration_summary, make_inputs
from qnn_prepare.causal_lm import TINY_DECODERS, eager_logits, export_methods, load_causal_lm
from qnn_prepare.causal_lm import text_sequences as lm_text_sequences
from qnn_prepare.kv_io import export_kv_io_methods, kv_layout
from qnn_prepare.models import BUILTIN_MODELS, export_program, is_factory_spec, load_model
from qnn_prepare.provenance import factory_digest

PACKAGE = "qnn-prepare"
log = logging.getLogger(__name__)


def source_digests(config: PrepareConfig) -> dict[str, str]:
    """Digests of what the output is made from: the model's files, and a calibration file."""
    digests = {"model": _model_digest(config.model)}
    if config.calibration_file is not None and config.calibration_file.is_file():
        digests["calibration_file"] = sha256_file(config.calibration_file)
    return digests


def _model_digest(spec: str) -> str:
    spec = spec.strip()
    path = Path(spec).expanduser()
    if spec not in BUILTIN_MODELS and spec not in TINY_DECODERS and path.is_dir():
        h = hashlib.sha256()
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(path)).encode())
            h.update(sha256_file(f).encode())
        return h.hexdigest()
    if spec not in BUILTIN_MODELS and is_factory_spec(spec):
        # The code and weight files that define it: editing the function must miss the cache.
        return factory_digest(spec)
    # Built-ins are fixed by this package's code (part of the key).
    return hashlib.sha256(spec.encode()).hexdigest()


def prepare_cache_key(config: PrepareConfig) -> str:
    """The cache key of `config`'s artifact (see qnn_common.manifest.cache_key)."""
    return cache_key(Stage.PREPARE, config, source_digests(config), code_version(qnn_prepare))


def run_prepare(inp: PrepareInput) -> PrepareOutput:
    """Load, export, sample and seal: writes program.pt2, calibration and eval inputs, fp32
    reference outputs, tokenizer files, and manifest.json into `inp.out_dir`."""
    cfg = inp.config
    if cfg.kv_cache:
        return _run_prepare_causal_lm(inp)
    out = begin_artifact(inp.out_dir, inputs=[cfg.calibration_file, Path(cfg.model)])
    timings: dict[str, float] = {}
    torch.manual_seed(cfg.seed)

    t = time.perf_counter()
    model = load_model(cfg.model, seq_len=cfg.seq_len, seed=cfg.seed)
    timings["load_s"] = time.perf_counter() - t
    log.info("loaded %s (%s, %d inputs)", model.name, model.kind, len(model.example_inputs))

    t = time.perf_counter()
    program = export_program(model)
    timings["export_s"] = time.perf_counter() - t
    log.info("exported %s in %.1f s", model.name, timings["export_s"])

    calibration = make_inputs(
        model, num_samples=cfg.calibration_samples, source=cfg.calibration_file, seed=cfg.seed
    )
    # Held out from calibration (another seed): the example input first, then fresh samples.
    extra = cfg.eval_samples - 1
    eval_inputs = [model.example]
    if extra:
        eval_inputs += make_inputs(
            model, num_samples=extra, source=None, seed=cfg.seed + 1, include_example=False
        )

    t = time.perf_counter()
    module = program.module()
    with torch.no_grad():
        # On copies: a model that updates its inputs in place would otherwise change the eval
        # inputs saved below (which would then hold f(x), not x).
        reference = [_call(module, sample) for sample in eval_inputs]
    timings["reference_s"] = time.perf_counter() - t

    save_program(out / PROGRAM, program)
    save_samples(out / CALIBRATION, calibration)
    save_samples(out / EVAL_INPUTS, eval_inputs)
    save_samples(out / REFERENCE_FP32, reference)
    files = [PROGRAM, CALIBRATION, EVAL_INPUTS, REFERENCE_FP32]
    files += _copy_tokenizer(model.tokenizer_files, out / TOKENIZER_DIR)

    digests = source_digests(cfg)
    manifest = _seal(
        out, cfg, digests, files, timings,
        metrics={
            "model": model.name,
            "kind": model.kind,
            "input_names": list(model.input_names),
            "output_names": list(model.output_names),
            "input_shapes": [
                {"shape": list(x.shape), "dtype": str(x.dtype)}
                if isinstance(x, torch.Tensor)
                else {"value": x}
                for x in model.example.leaves()
            ],
            # What the program's flat inputs (above, in order) are the leaves of.
            **({} if model.example.is_flat() else {"input_structure": model.example.describe()}),
            "parameters": sum(p.numel() for p in model.module.parameters()),
            "calibration_samples": len(calibration),
            "eval_samples": len(eval_inputs),
            "calibration": calibration_summary(model, calibration, cfg.calibration_file),
        },
    )
    return PrepareOutput(inp.out_dir, manifest)


def _call(module: torch.nn.Module, sample: ModelInputs) -> Sample:
    """`module` on a copy of `sample`, its outputs flattened."""
    inputs = sample.clone()
    return flatten_outputs(module(*inputs.args, **inputs.kwargs))


def _copy_tokenizer(files: tuple[Path, ...], dest: Path) -> list[str]:
    if not files:
        return []
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    names = []
    for f in files:
        shutil.copyfile(f, dest / f.name)
        names.append(f"{TOKENIZER_DIR}/{f.name}")
    return names


def _run_prepare_causal_lm(inp: PrepareInput) -> PrepareOutput:
    """The causal-LM task: prefill + decode programs, text calibration, teacher-forced logits of
    the eager HF model as the reference, the tokenizer and chat template."""
    cfg = inp.config
    timings: dict[str, float] = {}
    torch.manual_seed(cfg.seed)
    t = time.perf_counter()
    lm = load_causal_lm(
        cfg.model, max_seq_len=cfg.max_seq_len, prefill_len=cfg.prefill_len, seed=cfg.seed
    )
    timings["load_s"] = time.perf_counter() - t
    spec = lm.spec
    out = begin_artifact(inp.out_dir, inputs=[cfg.calibration_file, Path(cfg.model)])

    t = time.perf_counter()
    if cfg.kv_io:
        programs, rope = export_kv_io_methods(lm)
        spec = dataclasses.replace(spec, kv_layout=kv_layout(lm))
    else:
        programs, rope = export_methods(lm), None
    timings["export_s"] = time.perf_counter() - t
    log.info("exported %s (%s) in %.1f s", lm.name, ", ".join(programs), timings["export_s"])

    # Windows of two prefill chunks: every sample crosses a chunk boundary, so calibration and
    # the teacher-forced eval see the cache being read, not only written.
    length = min(spec.max_seq_len, 2 * spec.prefill_len)
    calibration = lm_text_sequences(lm, cfg.calibration_samples, length)
    eval_tokens = lm_text_sequences(lm, cfg.eval_samples, length, offset=cfg.calibration_samples)
    t = time.perf_counter()
    reference = eager_logits(lm, eval_tokens)
    timings["reference_s"] = time.perf_counter() - t

    files = []
    for method, program in programs.items():
        save_program(out / method_program(method), program)
        files.append(method_program(method))
    save_samples(out / CALIBRATION, [(s,) for s in calibration])
    save_samples(out / EVAL_INPUTS, [(s,) for s in eval_tokens])
    save_samples(out / REFERENCE_FP32, [(r,) for r in reference])
    files += [CALIBRATION, EVAL_INPUTS, REFERENCE_FP32]
    if rope is not None:
        save_samples(out / ROPE_TABLE, [rope])
        files.append(ROPE_TABLE)
    for name, data in sorted(lm.tokenizer_files.items()):
        atomic_write_bytes(out / TOKENIZER_DIR / name, data)
        files.append(f"{TOKENIZER_DIR}/{name}")

    digests = source_digests(cfg)
    manifest = _seal(
        out, cfg, digests, files, timings,
        metrics={
            "model": lm.name,
            "kind": "causal-lm",
            "methods": list(programs),
            "llm": spec.to_json(),
            "input_names": ["input_ids", "cache_position"],
            "output_names": ["logits"],
            "parameters": sum(p.numel() for p in lm.hf.parameters()),
            "calibration_samples": len(calibration),
            "eval_samples": len(eval_tokens),
            "calibration": {
                "source": "text: Alice's Adventures in Wonderland, ch. 1 (public domain)",
                "tokens_per_sample": length,
            },
        },
    )
    return PrepareOutput(inp.out_dir, manifest)


def _seal(
    out: Path,
    cfg: Any,
    inputs: Mapping[str, str],
    files: Sequence[str],
    timings: Mapping[str, float],
    *,
    metrics: Mapping[str, Any],
    extra_tools: Mapping[str, str] | None = None,
) -> Manifest:
    return seal_stage(
        out, stage=Stage.PREPARE, package=PACKAGE, module=qnn_prepare, config=cfg, inputs=inputs,
        files=files, timings=timings, metrics=metrics, extra_tools=extra_tools,
    )

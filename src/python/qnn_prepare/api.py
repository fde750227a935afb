"""The prepare stage as a library call: model spec in, sealed artifact directory out."""

from __future__ import annotations

import copy
import hashlib
import logging
import shutil
import time
from pathlib import Path

import torch

import qnn_prepare
from qnn_common.config import PrepareConfig, Stage
from qnn_common.manifest import (
    begin_artifact,
    cache_key,
    code_version,
    sha256_file,
    write_manifest,
)
from qnn_common.stages import (
    CALIBRATION,
    EVAL_INPUTS,
    PROGRAM,
    REFERENCE_FP32,
    TOKENIZER_DIR,
    PrepareInput,
    PrepareOutput,
)
from qnn_common.tensorio import Sample, flatten_outputs, save_program, save_samples
from qnn_prepare.calibration import calibration_summary, make_calibration
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
    if spec not in BUILTIN_MODELS and path.is_dir():
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
    out = begin_artifact(inp.out_dir)
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

    calibration = make_calibration(
        model, num_samples=cfg.calibration_samples, source=cfg.calibration_file, seed=cfg.seed
    )
    # Held out from calibration (another seed): the example input first, then fresh samples.
    extra = cfg.eval_samples - 1
    eval_inputs: list[Sample] = [tuple(model.example_inputs)]
    if extra:
        eval_inputs += make_calibration(
            model, num_samples=extra, source=None, seed=cfg.seed + 1, include_example=False
        )

    t = time.perf_counter()
    module = program.module()
    with torch.no_grad():
        # On copies: a model that updates its inputs in place would otherwise change the eval
        # inputs saved below (which would then hold f(x), not x).
        reference = [flatten_outputs(module(*copy.deepcopy(sample))) for sample in eval_inputs]
    timings["reference_s"] = time.perf_counter() - t

    save_program(out / PROGRAM, program)
    save_samples(out / CALIBRATION, calibration)
    save_samples(out / EVAL_INPUTS, eval_inputs)
    save_samples(out / REFERENCE_FP32, reference)
    files = [PROGRAM, CALIBRATION, EVAL_INPUTS, REFERENCE_FP32]
    files += _copy_tokenizer(model.tokenizer_files, out / TOKENIZER_DIR)

    digests = source_digests(cfg)
    manifest = write_manifest(
        out,
        stage=Stage.PREPARE,
        package=PACKAGE,
        package_version=qnn_prepare.__version__,
        config=cfg,
        inputs=digests,
        files=files,
        cache_key=cache_key(Stage.PREPARE, cfg, digests, code_version(qnn_prepare)),
        timings={k: round(v, 3) for k, v in timings.items()},
        metrics={
            "model": model.name,
            "kind": model.kind,
            "input_names": list(model.input_names),
            "output_names": list(model.output_names),
            "input_shapes": [
                {"shape": list(x.shape), "dtype": str(x.dtype)} for x in model.example_inputs
            ],
            "parameters": sum(p.numel() for p in model.module.parameters()),
            "calibration_samples": len(calibration),
            "eval_samples": len(eval_inputs),
            "calibration": calibration_summary(model, calibration, cfg.calibration_file),
        },
    )
    return PrepareOutput(out, manifest)


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

"""The compile stage as a library call: an exported program in, a sealed .pte artifact out.

The source is a prepare or quantize artifact directory, or any `.pt2` written by
`torch.export.save`: compile does not care who exported the program.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import qnn_compile
from qnn_common.artifact import Artifact
from qnn_common.cache_keys import cache_key, code_version
from qnn_common.config import CompileConfig, Stage
from qnn_common.errors import ConfigValidationError
from qnn_common.manifest import Manifest, ProgramRecord
from qnn_common.recipes import BACKENDS
from qnn_common.reports import CompileReport
from qnn_common.sealing import seal_stage
from qnn_common.stages import (
    DEFAULT_METHOD,
    ETRECORD,
    PTE,
    CompileInput,
    carry_forward,
    llm_spec_of,
    program_files,
    quantized_for,
)
from qnn_common.store.artifact_dir import begin_artifact
from qnn_common.store.hashing import sha256_file
from qnn_common.torchio.programs import load_methods
from qnn_compile.backends import lowering_for, toolchain_digests
from qnn_compile.context_cache import one_context_per_method
from qnn_compile.lower import lower_program
from qnn_compile.shard_sizes import plan_shards
from qnn_compile.shards import boundaries

PACKAGE = "qnn-compile"
# What compile takes: a prepared or a quantized artifact (or a bare .pt2).
_UPSTREAM = (Stage.PREPARE, Stage.QUANTIZE)
log = logging.getLogger(__name__)


def _source(inp: CompileInput) -> tuple[dict[str, Path], Manifest | None]:
    """(method -> program file, upstream manifest, verified when the artifact was opened; None
    for a bare .pt2, the one method `forward`)."""
    upstream = inp.source.manifest_as(_UPSTREAM)
    if upstream is not None:
        files = program_files(inp.source.path, upstream)
        return {m: inp.source.path / f for m, f in files.items()}, upstream
    return {DEFAULT_METHOD: inp.source.path}, None


def _input_digests(config: CompileConfig, source: Artifact) -> dict[str, str]:
    """What the cache key and the sealed manifest's inputs cover, one rule for both: the
    upstream manifest's identity digest, or a bare .pt2's sha256; plus the toolchain's."""
    upstream = source.manifest_as(_UPSTREAM)
    if upstream is not None:
        digests = {upstream.stage: upstream.identity_digest()}
    else:
        digests = {"program": sha256_file(source.path)}
    return {**digests, **toolchain_digests(config.backend)}


def compile_cache_key(config: CompileConfig, source: Artifact) -> str:
    """The cache key of the artifact compiling `source` at `config`: from its manifest (or a bare
    .pt2's hash)."""
    return cache_key(Stage.COMPILE, config, _input_digests(config, source),
                     code_version(qnn_compile))


def _check_shards(source: Path, cfg: CompileConfig, upstream: Manifest | None) -> int | None:
    """--num-shards: before any lowering, the program must be a causal LM with at least that
    many decoder layers (its KV layout records them; shards.ShardLayers checks the graph too).
    Returns the layer count, or None when not sharding."""
    if cfg.num_shards == 1:
        return None
    spec = llm_spec_of(source, upstream) if upstream is not None else None
    if spec is None or spec.kv_layout is None:
        raise ConfigValidationError(
            "compile.num_shards", cfg.num_shards,
            "sharding splits a causal LM's decoder layers, and this program is not one "
            "(prepare it with --kv-cache, or --prompt in qnn-pipeline): drop --num-shards",
        )
    if isinstance(cfg.num_shards, int):
        boundaries(spec.kv_layout.layers, cfg.num_shards)  # refuses more shards than layers
    return spec.kv_layout.layers


def _check_matches_upstream(source: Path, cfg: CompileConfig, upstream: Manifest | None) -> None:
    """The target and recipe compile is told must be the ones the program was quantized for."""
    if upstream is None:  # a bare .pt2: nothing recorded to check against
        return
    if upstream.stage == Stage.PREPARE:
        if cfg.recipe.is_quantized:
            raise ConfigValidationError(
                "compile.recipe", cfg.recipe.value,
                "the source is a float (prepared) program; quantize it first, or compile "
                + BACKENDS[cfg.backend].float_recipe.value,
            )
        return
    target, recipe = quantized_for(source, upstream)
    if target != cfg.target or recipe is not cfg.recipe:
        soc = f" --soc {target.soc.name}" if target.soc is not None else ""
        raise ConfigValidationError(
            "compile", f"{cfg.target}/{cfg.recipe.value}",
            f"the program was quantized for {target}/{recipe.value}; compile it with "
            f"--backend {target.backend.value}{soc} --recipe {recipe.value}, or quantize again",
        )


def run_compile(inp: CompileInput) -> Artifact:
    """Lower to ExecuTorch for `inp.config`'s target and write model.pte (+ ETRecord)."""
    cfg = inp.config
    program_paths, upstream = _source(inp)
    _check_matches_upstream(inp.source.path, cfg, upstream)
    layers = _check_shards(inp.source.path, cfg, upstream)
    # The backend's lowering is built before any output is written: a missing SDK or an unknown
    # chipset is a clear error with nothing left behind.
    lowering = lowering_for(cfg)
    digests = _input_digests(inp.config, inp.source)
    programs = load_methods(program_paths, inp.source.programs)
    shards = None
    if layers is not None:  # sharded: how many contexts, from the program, before lowering
        graphs = 1 if one_context_per_method(cfg.weight_sharing) else len(programs)
        shards = plan_shards(cfg.num_shards, cfg.recipe, next(iter(programs.values())), layers,
                             graphs)
        if shards.count != cfg.num_shards:  # "auto", resolved: the lowering cuts that many
            lowering = lowering_for(dataclasses.replace(cfg, num_shards=shards.count))
    if cfg.weight_sharing and len(programs) == 1:
        raise ConfigValidationError(
            "compile.weight_sharing", True,
            "weight sharing shares weights between a program's methods, and this program has "
            f"one ({next(iter(programs))}); drop --weight-sharing",
        )
    out = begin_artifact(inp.out_dir, inputs=[inp.source.path])

    t = time.perf_counter()
    etrecord = out / ETRECORD if cfg.etrecord else None
    lowered = lower_program(programs, lowering, etrecord_path=etrecord,
                            payload_cache=inp.context_cache)
    seconds = time.perf_counter() - t
    # Streamed: joined in memory first, the program's bytes would be held twice at the peak.
    pte = lowered.write_pte(out / PTE)
    log.info(
        "lowered for %s in %.1f s: %d ops delegated, %d not, %d partition(s), %d bytes",
        cfg.target, seconds, lowered.delegated_ops, lowered.non_delegated_ops,
        lowered.partitions, pte.size,
    )

    files = [PTE] + ([ETRECORD] if etrecord is not None else [])
    if upstream is not None:
        files += carry_forward(inp.source.path, upstream, out)

    manifest = seal_stage(
        out,
        stage=Stage.COMPILE,
        package=PACKAGE,
        module=qnn_compile,
        config=cfg,
        inputs=digests,
        files=files,
        timings={"lower_s": seconds},
        metrics=CompileReport(
            model=upstream.metrics.get("model") if upstream else inp.source.path.name,
            target=dict(lowering.record),
            pte_bytes=pte.size,
            delegated_ops=lowered.delegated_ops,
            non_delegated_ops=lowered.non_delegated_ops,
            partitions=lowered.partitions,
            non_delegated_op_counts=lowered.op_counts,
            delegate_bytes=lowered.delegate_bytes,
            # --num-shards: the count lowered with, each shard's estimate beside its measure.
            shards=(shards.to_json(lowered.delegate_bytes, lowered.cached_payloads)
                    if shards else None),
            # With a context cache: each context built (and in how long) or reused.
            contexts=([r.to_json() for r in lowered.cached_payloads]
                      if lowered.cached_payloads else None),
        ).to_metrics(),
        extra_tools=lowering.tools,
        # What the .pte runs: the upstream record, or a bare .pt2's one method.
        program=upstream.program if upstream is not None else ProgramRecord(
            kind="custom", methods=tuple(programs)
        ),
    )
    return Artifact(inp.out_dir, manifest, pte_sha256=pte.sha256)

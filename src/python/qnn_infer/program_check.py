"""Is a compile artifact's program the one its manifest describes? What can be checked, is.

A manifest's digest is a plain sha256 of its content, and each file's entry a plain sha256 of
the file: integrity against accidents (a truncated copy, an edit, a half-written run), not
authenticity. Anyone can put another `.pte` in a compile artifact and re-seal it; issue 27 did,
and the fp32 program ran while the summary said "cached, 8a8w, 32,936 bytes". So the program
is also checked against what the manifest claims about it, from the file itself: its size
against the recorded `pte_bytes`, its delegates against the recorded backend (an XNNPACK or QNN
program with delegated ops must hold that backend's delegates and no other; a portable one
none), and for portable programs whether it calls the quantized kernels its recipe implies.
That catches a swapped program unless the forger also rewrote those claims to match it; then
the artifact is at least self-consistent about what it runs, and the report describes it.
"""

from __future__ import annotations

from pathlib import Path

from qnn_common.errors import ArtifactError
from qnn_common.manifest import Manifest
from qnn_common.recipes import BACKENDS
from qnn_common.stages import PTE, compiled_for
from qnn_infer.pte import program_contents

# The operator namespace of quantize / dequantize kernels outside any delegate.
_QUANTIZED_KERNELS = "quantized_decomposed::"


def check_program_matches(artifact: Path, manifest: Manifest) -> None:
    """Raise ArtifactError if `artifact/model.pte` is not the program `manifest` records."""
    pte = artifact / PTE
    target, recipe = compiled_for(artifact, manifest)
    delegates, operators = program_contents(pte)
    found = sorted({backend_id for ids in delegates.values() for backend_id in ids})
    expected = BACKENDS[target.backend].runtime_id
    metrics = manifest.metrics
    problems = []
    size, recorded = pte.stat().st_size, metrics.get("pte_bytes")
    if isinstance(recorded, int) and size != recorded:
        problems.append(f"it is {size:,} bytes, the manifest records {recorded:,}")
    foreign = [d for d in found if d != expected]
    if foreign:
        problems.append(f"it holds {', '.join(foreign)} delegates, the manifest records a "
                        f"{target.backend.value} program")
    delegated = metrics.get("delegated_ops")
    if expected is not None and isinstance(delegated, int) and delegated > 0 and not found:
        problems.append(f"it holds no {expected} delegate, the manifest records {delegated} "
                        "delegated ops")
    # Without a delegate every op runs on the kernels: a static recipe's program calls the
    # quantized_decomposed kernels, a float one none; 8da4w's affine ops decompose into plain
    # ATen ops, so its program shows nothing here.
    if expected is None and not recipe.is_dynamic:
        calls_quantized = any(op.startswith(_QUANTIZED_KERNELS) for op in operators)
        if calls_quantized != recipe.is_quantized:
            problems.append(f"it {'calls' if calls_quantized else 'has no'} quantized kernels, "
                            f"the manifest records recipe {recipe.value}")
    if problems:
        raise ArtifactError(
            pte,
            f"is not the program its manifest describes ({'; '.join(problems)}): the artifact "
            "was re-sealed around another program (a manifest's digest guards against "
            "accidents, not forgery: anyone can recompute it); compile it again from a source "
            "you trust",
        )

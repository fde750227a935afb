"""Each stage's input and output, and the file names inside artifact directories.

Data flows forward through files: a stage reads its input artifact (a directory sealed by a
manifest, or for compile / infer a bare .pt2 / .pte from anywhere) and writes its own artifact
directory. Evaluation inputs and reference outputs travel forward with every artifact, so infer
can judge a .pte against fp32 and fake-quant references without reaching back up the chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qnn_common.artifact import Artifact
from qnn_common.config import CompileConfig, InferConfig, PrepareConfig, QuantizeConfig
from qnn_common.errors import ArtifactError, PipelineError
from qnn_common.llm_spec import LlmSpec
from qnn_common.manifest import Manifest, ProgramRecord
from qnn_common.recipes import Recipe
from qnn_common.store.atomic import atomic_copy
from qnn_common.target import Target

# File names inside artifact directories.
# Every program artifact (prepare, quantize) holds one torch.export ExportedProgram (fp32 or
# PT2E-quantized) per method, as METHODS_DIR/<method>.pt2; the manifest's `program` section names
# the methods. For a causal LM, calibration / eval inputs hold token sequences and the
# references their logits.
METHODS_DIR = "methods"
DEFAULT_METHOD = "forward"
PROGRAM = f"{METHODS_DIR}/{DEFAULT_METHOD}.pt2"  # the program of a single-method model
PTE = "model.pte"  # the ExecuTorch program
# Under a pipeline's output directory: the HTP contexts its compiles built (CompileInput).
CONTEXT_CACHE_DIR = "htp-contexts"
CALIBRATION = "calibration.pt"  # list of input tuples used to calibrate observers
EVAL_INPUTS = "eval_inputs.pt"  # held-out input tuples; the first is the example input
REFERENCE_FP32 = "reference_fp32.pt"  # fp32 eager outputs on EVAL_INPUTS
REFERENCE_FAKE_QUANT = "reference_fake_quant.pt"  # fake-quantized eager outputs on EVAL_INPUTS
OUTPUTS = "outputs.pt"  # infer: the program's outputs on its inputs
TOKENIZER_DIR = "tokenizer"
ETRECORD = "etrecord.bin"
ETDUMP = "etdump.etdp"
ROPE_TABLE = "rope_table.pt"  # a KV-as-inputs LLM's (cos, sin) per position, fed by the host
SINK_TABLE = "sink_table.pt"  # its attention sink's (k, v) per layer, in the cache's first slot


# Files a stage hands on unchanged from its input artifact, so infer can judge and drive the
# program without reaching back up the chain. A stage that writes one of them itself (quantize
# its fake-quant reference) does not take it from upstream: its input has none.
CARRIED = (EVAL_INPUTS, REFERENCE_FP32, REFERENCE_FAKE_QUANT, ROPE_TABLE, SINK_TABLE)


def carry_forward(source: Path, upstream: Manifest, out: Path) -> list[str]:
    """Copy the carried files `upstream` (the manifest of `source`) holds into `out`, and the
    tokenizer's; return their names, for the new manifest."""
    names = [n for n in CARRIED if upstream.file(n) is not None]
    names += [f.path for f in upstream.files if f.path.startswith(f"{TOKENIZER_DIR}/")]
    for name in names:
        atomic_copy(source / name, out / name)
    return names


def method_program(method: str) -> str:
    """The file of one method's exported program in a prepare or quantize artifact."""
    return f"{METHODS_DIR}/{method}.pt2"


def program_of(source: Path, manifest: Manifest) -> ProgramRecord:
    """The program record of the artifact at `source`, or the error saying it has none."""
    if manifest.program is None:
        raise ArtifactError(
            source, f"its {manifest.stage} manifest records no program; rerun the stage that "
            "made it"
        )
    return manifest.program


def program_files(source: Path, manifest: Manifest) -> dict[str, str]:
    """Method name -> exported program file of a prepare or quantize artifact, in order."""
    return {m: method_program(m) for m in program_of(source, manifest).methods}


def llm_spec_of(source: Path, manifest: Manifest) -> LlmSpec | None:
    """The causal-LM shapes an artifact was exported with, or None for other programs."""
    data = None if manifest.program is None else manifest.program.llm
    if data is None:
        return None
    try:
        return LlmSpec.from_json(dict(data))
    except (KeyError, TypeError, ValueError) as err:
        raise ArtifactError(source, f"its manifest's llm record is invalid ({err})") from err


def _require(path: Path, what: str) -> None:
    if not path.exists():
        raise ArtifactError(path, f"{what} does not exist")


@dataclass(frozen=True)
class PrepareInput:
    config: PrepareConfig
    out_dir: Path


@dataclass(frozen=True)
class QuantizeInput:
    source: Artifact  # a prepare artifact
    config: QuantizeConfig
    out_dir: Path

    def __post_init__(self) -> None:
        _require(self.source.path, "the prepared artifact to quantize")


@dataclass(frozen=True)
class CompileInput:
    source: Artifact  # a prepare / quantize artifact, or any .pt2 file
    config: CompileConfig
    out_dir: Path
    # Where payloads worth keeping across compiles live (QNN: each HTP context, stored as soon
    # as built, so a killed compile resumes and a partly changed program rebuilds only what
    # changed); None: built every time. Not part of the cache key: it changes no output.
    context_cache: Path | None = None

    def __post_init__(self) -> None:
        _require(self.source.path, "the program to compile")


@dataclass(frozen=True)
class InferInput:
    source: Artifact  # a compile artifact, or any .pte file (its `pte_sha256`, when this
    # process's compile just wrote it, lets infer run it in-process without a rehearsal)
    config: InferConfig
    out_dir: Path

    def __post_init__(self) -> None:
        _require(self.source.path, "the program to run")


# --- typed accessors for facts that cross stages ------------------------------------------------
# A downstream stage learns what an upstream artifact was made for through these, never by reading
# another stage's config keys itself.


def _made_for(source: Path, manifest: Manifest, stage: str) -> tuple[Target, Recipe]:
    if manifest.stage != stage:
        raise ArtifactError(source, f"is a {manifest.stage} artifact, not a {stage} artifact")
    cfg = manifest.config
    try:
        return Target.parse(str(cfg["backend"]), cfg.get("soc")), Recipe(cfg["recipe"])
    except (KeyError, ValueError, PipelineError) as err:
        raise ArtifactError(
            source, f"its manifest does not record a valid target and recipe ({err})"
        ) from None


def quantized_for(source: Path, manifest: Manifest) -> tuple[Target, Recipe]:
    """The target and recipe the quantize artifact at `source` was quantized for."""
    return _made_for(source, manifest, "quantize")


def compiled_for(source: Path, manifest: Manifest) -> tuple[Target, Recipe]:
    """The target and recipe the compile artifact at `source` was built for."""
    return _made_for(source, manifest, "compile")

"""The on-disk artifact contract: one directory per stage output, sealed by `manifest.json`.

A stage calls `begin_artifact` (artifact_dir) for a fresh staging directory, writes its files there
(each atomically: temp file + rename), then calls `write_manifest`, which refuses to seal a file it
was not told about, hashes every listed file, writes `manifest.json` last and renames the directory
into place. The manifest is the commit marker, and it vouches only for what it checks:

* every listed file's sha256 and size, and nothing else: a directory holding an unlisted file is
  refused, so a stage can only ever read files the manifest vouches for;
* its own content: `digest` is the sha256 of the manifest's canonical JSON without that field,
  so an edited config or metric is refused rather than shown;
* its cache key: `key_basis` records the versions the key was computed from, so that
  `load_manifest(expect_cache_key=...)` can recompute the key from the recorded config and inputs
  and reuse a cached artifact only if they reproduce it.

`load_manifest` checks all of it and refuses a tampered, truncated or foreign artifact with the
path and the reason.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import math
import platform
import sys
import time
import types
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from qnn_common.errors import ArtifactError
from qnn_common.store.artifact_dir import FORMAT as FORMAT
from qnn_common.store.artifact_dir import MANIFEST_NAME as MANIFEST_NAME
from qnn_common.store.artifact_dir import MAX_MANIFEST_BYTES, is_staging, publish_artifact
from qnn_common.store.artifact_dir import begin_artifact as begin_artifact
from qnn_common.store.atomic import atomic_copy as atomic_copy
from qnn_common.store.atomic import atomic_path as atomic_path
from qnn_common.store.atomic import atomic_save as atomic_save
from qnn_common.store.atomic import atomic_write_bytes as atomic_write_bytes
from qnn_common.store.atomic import atomic_write_text as atomic_write_text
from qnn_common.store.atomic import is_temp_name
from qnn_common.store.hashing import sha256_file as sha256_file  # each file hashed once per process

# 2: the manifest's own digest, key_basis, and no unlisted files in an artifact directory.
# 3: the typed `program` section (kind, methods, LLM shapes), part of the identity.
SCHEMA_VERSION = 3

# Versions recorded in every manifest (distribution names, looked up without importing them).
TRACKED_DISTRIBUTIONS = ("torch", "executorch", "torchao", "transformers", "numpy")

# What an artifact *is*, as opposed to when and how fast it was made (timings, created_unix) or
# what was measured on it (metrics): the downstream stages' input digest covers only these, so
# the same inputs give the same cache keys and directory names on every machine and rerun.
_IDENTITY_FIELDS = tuple(
    "format schema_version stage package package_version config inputs files cache_key key_basis "
    "tools program".split()
)


@dataclass(frozen=True)
class FileEntry:
    """One output file: its path relative to the artifact directory, sha256 and size in bytes."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class ProgramRecord:
    """The program an artifact holds or was made from: what the stages downstream drive.

    `kind` is the model's kind as prepare loaded it ("vision", "text-encoder", "causal-lm",
    "custom"); `methods` its entry points in order, each exported as ``methods/<name>.pt2`` in a
    prepare or quantize artifact and a method of the compiled .pte; `llm` a generating causal
    LM's shapes, tokens and cache layout (`qnn_common.llm_spec.LlmSpec.to_json`), None for any
    other program.
    """

    kind: str
    methods: tuple[str, ...]
    llm: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.methods or not all(isinstance(m, str) and m for m in self.methods):
            raise TypeError(f"a program needs named methods, got {self.methods!r}")
        if len(set(self.methods)) != len(self.methods):
            raise TypeError(f"method names must be unique, got {self.methods!r}")
        if self.llm is not None and not isinstance(self.llm, Mapping):
            raise TypeError(f"the llm record must be a mapping, got {type(self.llm).__name__}")


@dataclass(frozen=True)
class Manifest:
    """What an artifact is, how it was made, and what it contains."""

    stage: str
    package: str
    package_version: str
    config: Mapping[str, Any]
    inputs: Mapping[str, str]  # input name -> digest (an upstream manifest's, or a file's sha256)
    files: tuple[FileEntry, ...]
    tools: Mapping[str, str]
    cache_key: str
    timings: Mapping[str, float] = field(default_factory=dict)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    # What program the artifact holds (prepare, quantize) or runs (compile, infer); None for an
    # artifact made from a bare file that records none.
    program: ProgramRecord | None = None
    created_unix: float = 0.0
    # The cache key's ingredients other than config and inputs (see cache_key).
    key_basis: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    format: str = FORMAT
    digest: str = ""  # sha256 of the canonical JSON of every other field

    def file(self, name: str) -> FileEntry | None:
        """The entry for `name`, or None if the artifact has no such file."""
        return next((f for f in self.files if f.path == name), None)

    def to_json(self) -> str:
        """The manifest as stored: indented JSON with sorted keys."""
        return json.dumps(self._plain(), indent=2, sort_keys=True) + "\n"

    def _plain(self) -> dict[str, Any]:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        return dict(to_jsonable(data))

    def sealed(self) -> Manifest:
        """This manifest with `digest` set to the digest of its content."""
        return replace(self, digest=_content_digest(self._plain()))


def _canonical_sha256(data: Any) -> str:
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _content_digest(plain: Mapping[str, Any]) -> str:
    return _canonical_sha256({k: v for k, v in plain.items() if k != "digest"})


# --- digests and versions --------------------------------------------------------------------


def to_jsonable(value: Any) -> Any:
    """Convert configs (dataclasses, enums, paths, sets) to plain JSON values, deterministically."""
    if is_dataclass(value) and not isinstance(value, type):
        return {k: to_jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted(to_jsonable(v) for v in value)
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        # Strict JSON has no inf / nan; float("inf") reads these strings back.
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


@functools.cache
def code_version(package: types.ModuleType) -> str:
    """`package.__version__` plus a digest of its own modules' source.

    Cache keys use this instead of the bare version, so that changed code invalidates cached
    artifacts even before anyone bumps the version (which is what happens during development).
    """
    root = Path(str(package.__file__)).parent
    h = hashlib.sha256()
    for f in sorted(root.glob("*.py")):
        if not f.name.endswith("_test.py"):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return f"{package.__version__}+{h.hexdigest()[:12]}"


# Cache key -> its basis, for every key this process computed: write_manifest records the basis
# of the key it is given, which a later run needs to recompute the key from the manifest.
_KEY_BASES: dict[str, dict[str, Any]] = {}


def cache_key(
    stage: str, config: Any, input_digests: Mapping[str, str], package_version: str
) -> str:
    """A digest of everything that determines a stage's output.

    Same config + same inputs + same package version => same key, so the pipeline may reuse the
    artifact instead of recomputing it. Tool versions are part of the key too: a torch or
    executorch upgrade invalidates every cached artifact.
    """
    basis = {
        "package_version": package_version,
        "contracts_version": code_version(sys.modules[__package__ or "qnn_common"]),
        "tools": tool_versions(),
        "schema_version": SCHEMA_VERSION,
    }
    key = _key_from(stage, config, input_digests, basis)
    _KEY_BASES[key] = basis
    return key


# Field metadata of a setting that changes how a run is shown, not what it computes (printing
# tokens as they come): left out of cache keys, so flipping it reuses the artifact.
NOT_IN_CACHE_KEY: Mapping[str, bool] = types.MappingProxyType({"cache_key": False})


def _identity(value: Any) -> Any:
    """`to_jsonable(value)` less the dataclass fields marked `NOT_IN_CACHE_KEY`."""
    if is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _identity(getattr(value, f.name))
            for f in fields(value) if f.metadata.get("cache_key", True)
        }
    if isinstance(value, Mapping):
        return {str(k): _identity(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_identity(v) for v in value]
    return to_jsonable(value)


def _key_from(
    stage: str, config: Any, input_digests: Mapping[str, str], basis: Mapping[str, Any]
) -> str:
    payload = {
        "stage": stage,
        "config": _identity(config),
        "inputs": dict(sorted(input_digests.items())),
        **basis,
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def tool_versions(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Python and the ML stack's versions (`not installed` where absent), plus `extra` (QNN)."""
    versions = {"python": platform.python_version()}
    for dist in TRACKED_DISTRIBUTIONS:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    versions.update(extra or {})
    return versions


# --- writing and loading ---------------------------------------------------------------------


def write_manifest(
    artifact_dir: Path,
    *,
    stage: str,
    package: str,
    package_version: str,
    config: Any,
    inputs: Mapping[str, str],
    files: Sequence[str],
    cache_key: str,
    timings: Mapping[str, float] | None = None,
    metrics: Mapping[str, Any] | None = None,
    extra_tools: Mapping[str, str] | None = None,
    program: ProgramRecord | None = None,
) -> Manifest:
    """Hash `files` (relative to `artifact_dir`) and seal the artifact with `manifest.json`.

    Temp files an interrupted write left are deleted first; any other file that is not listed is
    refused (sealing it would make the artifact carry a file nobody vouches for). If
    `artifact_dir` came from `begin_artifact`, the sealed directory is then renamed into place.
    """
    listed = {Path(rel) for rel in files}
    for rel in sorted(set(files)):
        p = artifact_dir / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise ArtifactError(p, "an output must lie inside the artifact directory")
        if Path(rel) == Path(MANIFEST_NAME):
            raise ArtifactError(p, f"{MANIFEST_NAME} is the seal itself; don't list it")
        if (link := _symlink_in(artifact_dir, rel)) is not None:
            raise _refuse_symlink(link)
        if not p.is_file():
            raise ArtifactError(p, "listed as an output but was not written")
    for extra in _unlisted(artifact_dir, listed):
        if extra.is_symlink():
            raise _refuse_symlink(extra)
        if is_temp_name(extra.name):
            extra.unlink(missing_ok=True)  # orphaned by a killed write; never sealed
        else:
            raise ArtifactError(
                extra,
                "is in the artifact directory but not listed as an output; refusing to "
                "seal a file the manifest would not vouch for (list it, or don't write it there)",
            )
    entries = []
    for rel in sorted(set(files)):
        p = artifact_dir / rel
        entries.append(FileEntry(rel, sha256_file(p), p.stat().st_size))
    manifest = Manifest(
        stage=stage,
        package=package,
        package_version=package_version,
        config=to_jsonable(config),
        inputs=dict(inputs),
        files=tuple(entries),
        tools=tool_versions(extra_tools),
        cache_key=cache_key,
        timings=dict(timings or {}),
        metrics=to_jsonable(dict(metrics or {})),
        program=program,
        created_unix=round(time.time(), 3),
        key_basis=_KEY_BASES.get(cache_key, {}),
    ).sealed()
    atomic_write_text(artifact_dir / MANIFEST_NAME, manifest.to_json())
    if is_staging(artifact_dir):
        publish_artifact(artifact_dir)
    return manifest


def _unlisted(artifact_dir: Path, listed: set[Path]) -> list[Path]:
    """Files under `artifact_dir` that are neither listed nor the manifest, and every symlink.

    A symlink is never part of an artifact, whether it points to a file or a directory (rglob
    does not descend into a linked directory, whose files would otherwise go unchecked).
    """
    return sorted(
        p
        for p in artifact_dir.rglob("*")
        if p.is_symlink()
        or (
            not p.is_dir()
            and (rel := p.relative_to(artifact_dir)) not in listed
            and rel != Path(MANIFEST_NAME)
        )
    )


def _symlink_in(artifact_dir: Path, rel: str) -> Path | None:
    """The first symlink along `rel` below `artifact_dir`, if any."""
    p = artifact_dir
    for part in Path(rel).parts:
        p = p / part
        if p.is_symlink():
            return p
    return None


def _refuse_symlink(link: Path) -> ArtifactError:
    return ArtifactError(
        link,
        "is a symbolic link; an artifact holds its own files and directories, and the manifest "
        "vouches for nothing a link points to: replace it with the real file or directory, or "
        "rerun the stage that made the artifact",
    )


def manifest_digest(artifact_dir: Path) -> str:
    """The digest a downstream stage records as its input: of what the artifact is.

    It covers the manifest's identity (stage, package, config, inputs, every file's sha256, cache
    key and tools), not its timings, creation time or metrics, so rerunning a stage on the same
    inputs gives downstream stages the same cache keys. The manifest's own digest is checked.
    """
    manifest = load_manifest(artifact_dir, verify=False)
    plain = manifest._plain()
    return _canonical_sha256({k: plain[k] for k in _IDENTITY_FIELDS})


def load_manifest(
    artifact_dir: Path,
    *,
    expect_stage: str | Sequence[str] | None = None,
    verify: bool = True,
    expect_cache_key: str | None = None,
) -> Manifest:
    """Read and check an artifact; raise ArtifactError naming the path and the reason.

    Refuses: a missing directory or manifest (an interrupted or foreign output), a manifest that
    is not ours or of another schema, or whose content does not match its own digest (edited),
    a stage other than `expect_stage`, and a cache key other than `expect_cache_key` or one its
    recorded config and inputs do not reproduce. With `verify`, also any listed file that is
    missing or whose size or sha256 differ from the record, and any file that is not listed.
    """
    artifact_dir = Path(artifact_dir)
    path = artifact_dir / MANIFEST_NAME
    if not artifact_dir.is_dir():
        raise ArtifactError(artifact_dir, "no such artifact directory")
    if not path.is_file():
        raise ArtifactError(
            artifact_dir,
            f"no {MANIFEST_NAME}: not an artifact of this pipeline, or its run was interrupted; "
            "rerun the stage that produces it",
        )
    size = path.stat().st_size
    if size > MAX_MANIFEST_BYTES:
        raise ArtifactError(
            path,
            f"manifest is {size / 2**20:.1f} MiB, past the {MAX_MANIFEST_BYTES >> 20} MiB any "
            "stage writes; not read; rerun the stage",
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(path, f"manifest is not valid JSON ({err}); rerun the stage") from None
    except RecursionError:
        raise ArtifactError(
            path, "manifest is nested too deeply to be one of ours; rerun the stage"
        ) from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ArtifactError(path, f"not a {FORMAT} manifest (foreign file?)")
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise ArtifactError(
            path,
            f"schema version {raw.get('schema_version')!r}, this tool reads {SCHEMA_VERSION}; "
            "rerun the stage with this version",
        )
    try:
        digest = _content_digest(raw)
    except RecursionError:  # a value nested deep inside an object that passed the checks above
        raise ArtifactError(
            path, "manifest is nested too deeply to be one of ours; rerun the stage"
        ) from None
    if raw.get("digest") != digest:
        raise ArtifactError(
            path,
            "content does not match the manifest's own digest: it was edited after the stage "
            "sealed it, so nothing it records can be trusted; rerun the stage that made it",
        )
    try:
        files = tuple(FileEntry(**f) for f in raw.pop("files"))
        record = raw.pop("program", None)
        program = (
            None if record is None
            else ProgramRecord(
                kind=record["kind"], methods=tuple(record["methods"]), llm=record.get("llm")
            )
        )
        manifest = Manifest(files=files, program=program, **raw)
        if not all(isinstance(f.path, str) and isinstance(f.size, int) for f in files):
            raise TypeError("file entries need a string path and an integer size")
    except (TypeError, KeyError) as err:
        raise ArtifactError(path, f"manifest is malformed ({err})") from None
    if expect_stage is not None:
        wanted = (expect_stage,) if isinstance(expect_stage, str) else tuple(expect_stage)
        if manifest.stage not in wanted:
            raise ArtifactError(
                artifact_dir,
                f"is a {manifest.stage} artifact; expected {' or '.join(wanted)}",
            )
    if expect_cache_key is not None:
        _check_cache_key(path, manifest, expect_cache_key)
    if verify:
        for entry in manifest.files:
            _verify_entry(artifact_dir, entry)
        listed = {Path(f.path) for f in manifest.files}
        for extra in _unlisted(artifact_dir, listed):
            if extra.is_symlink():
                raise _refuse_symlink(extra)
            raise ArtifactError(
                extra,
                "is not listed in the artifact's manifest, which vouches only for listed files; "
                "remove it, or rerun the stage that made the artifact",
            )
    return manifest


def _check_cache_key(path: Path, manifest: Manifest, expected: str) -> None:
    if manifest.cache_key != expected:
        raise ArtifactError(
            path,
            f"made for cache key {manifest.cache_key[:12]}..., expected {expected[:12]}...; "
            "rerun the stage",
        )
    recomputed = _key_from(manifest.stage, manifest.config, manifest.inputs, manifest.key_basis)
    if recomputed != expected:
        raise ArtifactError(
            path,
            "its recorded config, inputs and versions do not reproduce its cache key "
            f"({recomputed[:12]}... != {expected[:12]}...), so it cannot vouch for being this "
            "stage's output; rerun the stage",
        )


def _verify_entry(artifact_dir: Path, entry: FileEntry) -> None:
    p = artifact_dir / entry.path
    if Path(entry.path).is_absolute() or ".." in Path(entry.path).parts:
        raise ArtifactError(p, "manifest lists a path outside the artifact directory")
    if (link := _symlink_in(artifact_dir, entry.path)) is not None:
        raise _refuse_symlink(link)
    if not p.is_file():
        raise ArtifactError(p, "listed in the manifest but missing; rerun the stage")
    size = p.stat().st_size
    if size != entry.size:
        raise ArtifactError(
            p,
            f"size {size} bytes, manifest says {entry.size} (truncated or modified); "
            "rerun the stage",
        )
    digest = sha256_file(p)
    if digest != entry.sha256:
        raise ArtifactError(
            p,
            f"sha256 {digest[:12]}..., manifest says {entry.sha256[:12]}... (modified); "
            "rerun the stage",
        )


def seal_stage(
    artifact_dir: Path,
    *,
    stage: str,
    package: str,
    module: types.ModuleType,
    config: Any,
    inputs: Mapping[str, str],
    files: Sequence[str],
    timings: Mapping[str, float],
    metrics: Mapping[str, Any],
    extra_tools: Mapping[str, str] | None = None,
    program: ProgramRecord | None = None,
) -> Manifest:
    """`write_manifest` for a stage package: its version, and the cache key from its code."""
    return write_manifest(
        artifact_dir,
        stage=stage,
        package=package,
        package_version=str(getattr(module, "__version__", "0")),
        config=config,
        inputs=inputs,
        files=files,
        cache_key=cache_key(stage, config, inputs, code_version(module)),
        timings={k: round(v, 3) for k, v in timings.items()},
        metrics=metrics,
        extra_tools=extra_tools,
        program=program,
    )

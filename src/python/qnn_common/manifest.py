"""The on-disk artifact contract: one directory per stage output, sealed by `manifest.json`.

A stage writes its files into its artifact directory (each atomically: temp file + rename), then
calls `write_manifest`, which hashes every file and writes `manifest.json` last, also atomically.
The manifest is the commit marker: a directory without one is an interrupted run and is refused.
`load_manifest` re-hashes every listed file and refuses a tampered, truncated or foreign artifact
with the path and the reason.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from qnn_common.errors import ArtifactError

MANIFEST_NAME = "manifest.json"
FORMAT = "qnn-pipeline-artifact"
SCHEMA_VERSION = 1

# Versions recorded in every manifest (distribution names, looked up without importing them).
TRACKED_DISTRIBUTIONS = ("torch", "executorch", "torchao", "transformers", "numpy")


@dataclass(frozen=True)
class FileEntry:
    """One output file: its path relative to the artifact directory, sha256 and size in bytes."""

    path: str
    sha256: str
    size: int


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
    created_unix: float = 0.0
    schema_version: int = SCHEMA_VERSION
    format: str = FORMAT

    def file(self, name: str) -> FileEntry | None:
        """The entry for `name`, or None if the artifact has no such file."""
        return next((f for f in self.files if f.path == name), None)

    def to_json(self) -> str:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        return json.dumps(to_jsonable(data), indent=2, sort_keys=True) + "\n"


# --- atomic writes ---------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success rename it over `path`, on failure delete it.

    The temp file lives in the same directory so the final `os.replace` is an atomic rename: a
    reader sees the old file or the complete new one, never a partial write.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # Keep the real suffix last: torch.export.save warns about archives not ending in .pt2.
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}", dir=path.parent
    )
    os.close(fd)
    # mkstemp creates 0600; artifacts are shared files, so honour the umask like open() does.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_name, 0o666 & ~umask)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_save(path: Path, writer: Callable[[Path], None]) -> None:
    """Let `writer` write to a temp path, then rename it to `path` (e.g. torch.export.save)."""
    with atomic_path(path) as tmp:
        writer(tmp)


def begin_artifact(artifact_dir: Path) -> Path:
    """Create `artifact_dir` and unseal it (drop an old manifest) before writing new files.

    Without this, a run interrupted while overwriting an old artifact would leave old seal + new
    files; `load_manifest` would catch the mismatch, but unsealing first says what happened.
    """
    artifact_dir.mkdir(parents=True, exist_ok=True)
    (artifact_dir / MANIFEST_NAME).unlink(missing_ok=True)
    return artifact_dir


def atomic_copy(src: Path, dst: Path) -> None:
    """Copy a file atomically (for files carried forward from an upstream artifact)."""
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


# --- digests and versions --------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


def cache_key(
    stage: str, config: Any, input_digests: Mapping[str, str], package_version: str
) -> str:
    """A digest of everything that determines a stage's output.

    Same config + same inputs + same package version => same key, so the pipeline may reuse the
    artifact instead of recomputing it. Tool versions are part of the key too: a torch or
    executorch upgrade invalidates every cached artifact.
    """
    payload = {
        "stage": stage,
        "config": to_jsonable(config),
        "inputs": dict(sorted(input_digests.items())),
        "package_version": package_version,
        "contracts_version": code_version(sys.modules[__package__ or "qnn_common"]),
        "tools": tool_versions(),
        "schema_version": SCHEMA_VERSION,
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
) -> Manifest:
    """Hash `files` (relative to `artifact_dir`) and seal the artifact with `manifest.json`."""
    entries = []
    for rel in sorted(set(files)):
        p = artifact_dir / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise ArtifactError(p, "an output must lie inside the artifact directory")
        if Path(rel) == Path(MANIFEST_NAME):
            raise ArtifactError(p, f"{MANIFEST_NAME} is the seal itself; don't list it")
        if not p.is_file():
            raise ArtifactError(p, "listed as an output but was not written")
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
        created_unix=round(time.time(), 3),
    )
    atomic_write_text(artifact_dir / MANIFEST_NAME, manifest.to_json())
    return manifest


def manifest_digest(artifact_dir: Path) -> str:
    """sha256 of an artifact's manifest.json: the digest a downstream stage records as its input."""
    return sha256_file(artifact_dir / MANIFEST_NAME)


def load_manifest(
    artifact_dir: Path, *, expect_stage: str | Sequence[str] | None = None, verify: bool = True
) -> Manifest:
    """Read and check an artifact; raise ArtifactError naming the path and the reason.

    Refuses: a missing directory or manifest (an interrupted or foreign output), a manifest that
    is not ours or of another schema, a stage other than `expect_stage`, and (with `verify`) any
    listed file that is missing or whose size or sha256 differ from the record.
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
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(path, f"manifest is not valid JSON ({err}); rerun the stage") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ArtifactError(path, f"not a {FORMAT} manifest (foreign file?)")
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise ArtifactError(
            path,
            f"schema version {raw.get('schema_version')!r}, this tool reads {SCHEMA_VERSION}; "
            "rerun the stage with this version",
        )
    try:
        files = tuple(FileEntry(**f) for f in raw.pop("files"))
        manifest = Manifest(files=files, **raw)
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
    if verify:
        for entry in manifest.files:
            _verify_entry(artifact_dir, entry)
    return manifest


def _verify_entry(artifact_dir: Path, entry: FileEntry) -> None:
    p = artifact_dir / entry.path
    if Path(entry.path).is_absolute() or ".." in Path(entry.path).parts:
        raise ArtifactError(p, "manifest lists a path outside the artifact directory")
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
            p, f"sha256 {digest[:12]}..., manifest says {entry.sha256[:12]}... (modified); "
            "rerun the stage"
        )

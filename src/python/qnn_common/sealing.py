"""Sealing and opening artifacts: `manifest.json` written last, and checked on every read.

A stage calls `begin_artifact` (store.artifact_dir) for a fresh staging directory, writes its files
there (each atomically: temp file + rename), then calls `seal_stage` / `write_manifest`, which
refuses to seal a file it was not told about, hashes every listed file, writes `manifest.json`
last and renames the directory into place: the manifest is the commit marker.

`load_manifest` checks all of it (qnn_common.manifest says what a manifest vouches for) and refuses
a tampered, truncated or foreign artifact with the path and the reason.
"""

from __future__ import annotations

import time
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qnn_common.cache_keys import (
    cache_key,
    code_version,
    key_basis_of,
    key_from,
    keyed,
    tool_versions,
)
from qnn_common.errors import ArtifactError
from qnn_common.manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    ProgramRecord,
    parse_manifest,
    read_manifest_json,
    to_jsonable,
)
from qnn_common.store.artifact_dir import MAX_MANIFEST_BYTES, is_staging, publish_artifact
from qnn_common.store.atomic import atomic_write_text, is_temp_name
from qnn_common.store.hashing import sha256_file


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
        config=keyed(config),  # as its key hashes it, so that the record reproduces the key
        inputs=dict(inputs),
        files=tuple(entries),
        tools=tool_versions(extra_tools),
        cache_key=cache_key,
        timings=dict(timings or {}),
        metrics=to_jsonable(dict(metrics or {})),
        program=program,
        created_unix=round(time.time(), 3),
        key_basis=key_basis_of(cache_key),
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
    return load_manifest(artifact_dir, verify=False).identity_digest()


def check_stage(
    artifact_dir: Path, manifest: Manifest, expect_stage: str | Sequence[str]
) -> Manifest:
    """`manifest` (of the artifact at `artifact_dir`) if its stage is `expect_stage` (or one of
    them); else the ArtifactError saying what it is."""
    wanted = (expect_stage,) if isinstance(expect_stage, str) else tuple(expect_stage)
    if manifest.stage not in wanted:
        raise ArtifactError(
            artifact_dir, f"is a {manifest.stage} artifact; expected {' or '.join(wanted)}",
        )
    return manifest


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
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ArtifactError(
            path, f"manifest is not valid JSON (not UTF-8 text: {err}); rerun the stage"
        ) from None
    manifest = parse_manifest(read_manifest_json(text, path), path)
    if expect_stage is not None:
        check_stage(artifact_dir, manifest, expect_stage)
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
    recomputed = key_from(manifest.stage, manifest.config, manifest.inputs, manifest.key_basis)
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

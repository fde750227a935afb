"""What a stage returns and the next one receives: an `Artifact`.

A sealed artifact directory with its verified manifest, or a bare `.pt2` / `.pte` file (no
manifest) given to compile or infer from anywhere; within one process also the programs its
stage saved (`qnn_common.torchio.programs.SavedProgram`, which the next stage takes in memory
instead of loading the file again) and, for a compile that just ran, its `.pte`'s sha256 (infer
then runs that program in-process without rehearsing it). Importing this module needs no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qnn_common.errors import ArtifactError
from qnn_common.manifest import Manifest
from qnn_common.sealing import check_stage, load_manifest

if TYPE_CHECKING:
    from qnn_common.torchio.programs import SavedProgram  # pants: no-infer-dep


@dataclass(frozen=True)
class Artifact:
    """A stage's result as the next stage receives it (module docstring)."""

    path: Path
    manifest: Manifest | None = None  # None: a bare .pt2 / .pte file
    # Programs by method name, as the stage saved them in this process; empty when the artifact
    # was made elsewhere, or cached.
    programs: Mapping[str, SavedProgram] = field(default_factory=dict, repr=False)
    # The .pte's sha256 as this process's compile wrote it; None for anything found on disk.
    pte_sha256: str | None = None

    def __post_init__(self) -> None:
        if self.manifest is None and self.path.is_dir():
            # Taken for a bare file, a directory would be read as one program.
            raise ArtifactError(
                self.path, "is a directory given without its manifest: open it with "
                "Artifact.open(path), which reads and verifies the manifest",
            )

    @classmethod
    def open(cls, path: Path, expect_stage: str | tuple[str, ...] | None = None) -> Artifact:
        """The artifact directory at `path` with its manifest verified (of `expect_stage`, if
        given), or a bare file."""
        if path.is_dir():
            return cls(path, load_manifest(path, expect_stage=expect_stage))
        if not path.exists():
            raise ArtifactError(path, "does not exist")
        return cls(path)

    @property
    def sealed(self) -> Manifest:
        """The manifest of a sealed artifact (what every stage returns); a bare file has none."""
        if self.manifest is None:
            raise ArtifactError(self.path, "is a bare file, not a sealed artifact directory")
        return self.manifest

    def sealed_as(self, expect_stage: str | tuple[str, ...]) -> Manifest:
        """The manifest of a sealed artifact of `expect_stage` (or one of them); else the
        ArtifactError saying what the artifact is."""
        return check_stage(self.path, self.sealed, expect_stage)

    def manifest_as(self, expect_stage: str | tuple[str, ...]) -> Manifest | None:
        """`sealed_as` for a directory; None for a bare file (compile's .pt2, infer's .pte)."""
        return None if self.manifest is None else self.sealed_as(expect_stage)

    def metrics(self, name: str) -> dict[str, Any]:
        """A copy of the manifest's `name` metrics table (empty when it has none, or for a bare
        file)."""
        table = None if self.manifest is None else self.manifest.metrics.get(name)
        return dict(table) if isinstance(table, Mapping) else {}

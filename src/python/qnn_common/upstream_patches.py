"""The index's record of one patch of torch or ExecuTorch internals, the upstream versions every
patch was read against, and the patches qnn_common's own modules make (standard library only:
names, never the patched code).

The one index is `qnn_compile.upstream_patches.PATCHES`: these entries and qnn_compile's, with
`upstream_patches_test` holding all of them to the installed packages (every replaced attribute
still upstream; a torch or ExecuTorch upgrade fails it until each patch has been read again
against the new upstream code and `WRITTEN_FOR` moved). qnn_common cannot import qnn_compile, so
the record type and the pin live here.
"""

from __future__ import annotations

from dataclasses import dataclass

# The upstream (major.minor) every patch in the index was read against.
WRITTEN_FOR = {"torch": "2.13", "executorch": "1.5"}


@dataclass(frozen=True)
class UpstreamPatch:
    """One module's replacements: `module` is ours, dotted in full (qnn_compile's hold `_PATCH`)."""

    module: str
    # Upstream attributes, "package.module.attribute" or "package.module.Class.attribute".
    replaces: frozenset[str]
    why: str
    test: str  # the test that fails if the replacement stops doing what the stock code did
    # Attributes upstream does not define and the patch adds while active.
    adds: frozenset[str] = frozenset()


# What qnn_common.torchio changes in torch.export's loader.
PATCHES = (
    UpstreamPatch(
        "qnn_common.torchio.known_weights",
        frozenset({"torch.export.pt2_archive._package._build_file_map"}),
        "only inside one `load_program(..., known=...)`: a method's weights equal to another "
        "loaded method's are that method's storage, not a copy (off, with a warning, if torch "
        "moves it)",
        "src/python/qnn_common/torchio/known_weights_test.py",
    ),
    UpstreamPatch(
        "qnn_common.torchio.serde_speed",
        frozenset({"torch._export.serde.serialize.typing"}),
        "for the process once installed: the serde schema's type hints are computed once per "
        "class, not for every object torch.export.load builds",
        "src/python/qnn_common/torchio/serde_speed_test.py",
    ),
)

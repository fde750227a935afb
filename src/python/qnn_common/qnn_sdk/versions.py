"""The QNN versions ExecuTorch's QNN backend was built against, and how versions are written."""

from __future__ import annotations

from collections.abc import Sequence

# executorch 1.5.1 was built against QNN 2.37 (QNN core API 2.27).
EXECUTORCH_QNN_VERSION = (2, 37)
EXECUTORCH_VERSION = "1.5.1"
# From 2.47 on (at the latest) the HTP device custom config has the 16-byte layout that
# ExecuTorch 1.5.1 does not write; htp_bridge.c explains the change.
CUSTOM_CONFIG_LAYOUT_CHANGED = (2, 47)


def version_text(parts: Sequence[int]) -> str:
    """(2, 37) -> "2.37"."""
    return ".".join(str(p) for p in parts)

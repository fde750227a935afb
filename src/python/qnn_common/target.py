"""A compile target: a backend, plus the SoC for backends that compile for one chip.

Quantize, compile and infer each receive the target explicitly. There is no default SoC anywhere:
a QNN target without one is refused, and so is a SoC given to a backend that ignores it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import BACKENDS, Backend, parse_enum
from qnn_common.soc import Soc, lookup_soc

# Backends whose programs are compiled for one SoC.


@dataclass(frozen=True)
class Target:
    """Where a program runs: `backend`, and `soc` exactly when the backend needs one."""

    backend: Backend
    soc: Soc | None = None

    def __post_init__(self) -> None:
        if BACKENDS[self.backend].needs_soc and self.soc is None:
            raise ConfigValidationError(
                "soc", None,
                f"the {self.backend.value} backend compiles for one SoC; pass one (e.g. --soc "
                "SM8650; --list-socs shows them all)",
            )
        if not BACKENDS[self.backend].needs_soc and self.soc is not None:
            raise ConfigValidationError(
                "soc", self.soc.name,
                f"the {self.backend.value} backend runs on the host and takes no SoC; drop --soc "
                "or use --backend qnn",
            )

    @classmethod
    def parse(cls, backend: Backend | str, soc: Soc | str | None = None,
              field: str = "soc") -> Target:
        """Build a target from names as users type them ("qnn", "sm8650")."""
        b = backend if isinstance(backend, Backend) else parse_enum(Backend, backend, "backend")
        s = soc if isinstance(soc, Soc) or soc is None else lookup_soc(soc, field)
        return cls(b, s)

    def __str__(self) -> str:
        return self.backend.value if self.soc is None else f"{self.backend.value}/{self.soc.name}"

    def record(self) -> dict[str, Any]:
        """The target as manifests store it."""
        rec: dict[str, Any] = {"backend": self.backend.value, "soc": None}
        if self.soc is not None:
            rec.update(soc=self.soc.name, htp_arch=str(self.soc.htp_arch),
                       vtcm_mb=self.soc.vtcm_mb)
        return rec

"""The error hierarchy every package raises.

Catch `PipelineError` to handle anything this project reports on purpose; everything else is a bug.
Each message says what went wrong and what to do next, so a CLI can print `str(err)` and exit.
"""

from __future__ import annotations

from pathlib import Path

_SHOWN_CHARS = 200  # of a bad value's repr in a ConfigValidationError's message


class PipelineError(Exception):
    """Base of every error this project raises deliberately.

    `stage` names the stage the error came out of, when it came out of one: StageError sets it, and
    the orchestrator stamps it on any other PipelineError leaving a stage (a config error found
    while preparing, a corrupt artifact met while compiling), so every failure says where.
    """

    stage: str | None = None


class ConfigValidationError(PipelineError, ValueError):
    """A configuration value is invalid.

    `field` is the dotted path of the offending field (e.g. ``quantize.recipe``), so TOML users can
    find it; `value` is what was given; `allowed` lists what would have been accepted, if finite.
    """

    def __init__(
        self,
        field: str,
        value: object,
        reason: str,
        allowed: tuple[str, ...] | None = None,
    ) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        self.allowed = allowed
        shown = repr(value)
        if len(shown) > _SHOWN_CHARS:  # a value from a file may be megabytes: show its start
            shown = f"{shown[:_SHOWN_CHARS]}... ({len(shown):,} characters)"
        msg = f"{field}: {shown} is invalid: {reason}"
        if allowed:
            msg += f" (allowed: {', '.join(allowed)})"
        super().__init__(msg)


class InputError(PipelineError, ValueError):
    """Data given to a program does not fit it: the wrong number of inputs, a dtype, a shape.

    `field` names the input (``inputs``, ``inputs[0]``), `value` describes what was given, and
    `reason` what the program takes instead. Not a configuration error: the settings are fine,
    the data is not.
    """

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}: {value!r} does not fit the program: {reason}")


class BackendNotAvailableError(PipelineError):
    """A backend, engine or tool the configuration asks for is not installed or cannot run here."""


class ArtifactError(PipelineError):
    """An artifact on disk is missing, corrupt, tampered with, or not one of ours."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class StageError(PipelineError):
    """A stage failed; `stage` names it and the original exception is chained as `__cause__`."""

    def __init__(self, stage: str, message: str, cause: BaseException | None = None) -> None:
        self.stage = stage
        self.message = message
        super().__init__(f"[{stage}] {message}")
        if cause is not None:
            self.__cause__ = cause

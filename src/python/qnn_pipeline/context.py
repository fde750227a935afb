"""One pipeline run's settings: the stage configs, consistent across stages, from flat settings
(`PipelineContext.create`) or from TOML (`load_pipeline_toml`).

The stage configs themselves are contracts every stage reads (`qnn_common.config`); how a run
assembles them, and the TOML file that describes one, are the orchestrator's. Errors name the
field path, the bad value and what is allowed; unknown keys are errors, never ignored.

TOML layout (every key optional except `pipeline.model`)::

    [pipeline]
    model = "minilm"          # built-in name, HF directory, or package.module:function
    backend = "xnnpack"       # xnnpack | qnn | portable
    recipe = "8a8w"
    soc = "SM8650"            # required for qnn
    out = "out"
    skip = ["quantize"]
    stop_after = "compile"

    [prepare]
    seq_len = 128

    [quantize]
    per_channel = true

    [compile]
    etrecord = false

    [infer]
    runs = 20
    min_sqnr_db_vs_fake_quant = 12.0   # accuracy gates; unset = the recipe's default
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from qnn_common.config import (
    CompileConfig,
    InferConfig,
    PrepareConfig,
    QuantizeConfig,
    Stage,
)
from qnn_common.config.toml_file import read_toml
from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import BACKENDS, Backend, Recipe, parse_enum
from qnn_common.soc import lookup_soc


@dataclass(frozen=True)
class PipelineContext:
    """Everything one pipeline run needs, consistent across stages.

    Build it with `PipelineContext.create(...)` (flat, named parameters) or from TOML with
    `load_pipeline_toml`; both end in this constructor, which checks cross-stage consistency.
    """

    prepare: PrepareConfig
    quantize: QuantizeConfig | None
    compile: CompileConfig
    infer: InferConfig = field(default_factory=InferConfig)
    out_dir: Path = Path("out")
    skip: frozenset[Stage] = frozenset()
    stop_after: Stage | None = None
    force: bool = False

    def __post_init__(self) -> None:
        no_buffers = not BACKENDS[self.compile.backend].mutable_buffers
        if self.prepare.kv_cache and no_buffers and not self.prepare.kv_io:
            raise ConfigValidationError(
                "prepare.kv_io", False,
                "QNN has no mutable buffers, so a KV-cache program for it keeps the cache as "
                "inputs and outputs: set kv_io (PipelineContext.create does it for QNN)",
            )
        if Stage.PREPARE in self.skip or Stage.COMPILE in self.skip:
            raise ConfigValidationError(
                "pipeline.skip",
                sorted(s.value for s in self.skip),
                "only quantize and infer can be skipped; start midway with --from ARTIFACT",
                allowed=(Stage.QUANTIZE.value, Stage.INFER.value),
            )
        quantized = self.compile.recipe.is_quantized
        if quantized and self.quantize is None:
            raise ConfigValidationError(
                "pipeline.recipe",
                self.compile.recipe.value,
                "a quantized recipe needs the quantize stage; drop `quantize` from skip, "
                "or pick fp32 / fp16",
            )
        if self.quantize is not None and (
            self.quantize.backend is not self.compile.backend
            or self.quantize.recipe is not self.compile.recipe
            or self.quantize.soc != self.compile.soc
        ):
            raise ConfigValidationError(
                "pipeline",
                "quantize vs compile",
                "quantize and compile must agree on backend, recipe and soc",
            )
        runs_here = Stage.INFER not in self.skip and self.stop_after in (None, Stage.INFER)
        if self.compile.weight_sharing and runs_here and self.infer.device is None:
            raise ConfigValidationError(
                "compile.weight_sharing", True,
                "a program whose methods share their weights runs on a device only: the x86 HTP "
                "emulator cannot load it (QNN: \"Shared weights buffer isn't supported on this "
                "platform\"); add --stop-after compile to build it for a device, or drop "
                "--weight-sharing to run the program here",
            )

    @classmethod
    def create(
        cls,
        model: str,
        *,
        backend: Backend | str = Backend.XNNPACK,
        recipe: Recipe | str | None = None,
        soc: str | None = None,
        out_dir: Path = Path("out"),
        skip: Iterable[Stage | str] = frozenset(),
        stop_after: Stage | str | None = None,
        force: bool = False,
        prepare: Mapping[str, Any] | None = None,
        quantize: Mapping[str, Any] | None = None,
        compile: Mapping[str, Any] | None = None,
        infer: Mapping[str, Any] | None = None,
    ) -> PipelineContext:
        """Build a context from flat pipeline-wide settings plus per-stage settings.

        `recipe=None` means 8a8w, or the backend's float recipe when quantize is skipped. A float
        recipe (fp32 / fp16) skips quantization by itself. Backend, recipe and stages (`skip`,
        `stop_after`) may be given by name ("qnn", "16a8w", "quantize"), as users type them.
        """
        names = (skip,) if isinstance(skip, str) else skip  # one stage's name, not its letters
        skipped = frozenset(
            s if isinstance(s, Stage) else parse_enum(Stage, str(s), "pipeline.skip")
            for s in names
        )
        last = stop_after
        if last is not None and not isinstance(last, Stage):
            last = parse_enum(Stage, str(last), "pipeline.stop_after")
        if not isinstance(backend, Backend):
            backend = parse_enum(Backend, str(backend), "pipeline.backend")
        if recipe is not None and not isinstance(recipe, Recipe):
            recipe = parse_enum(Recipe, str(recipe), "pipeline.recipe")
        if recipe is None:
            float_recipe = BACKENDS[backend].float_recipe
            recipe = float_recipe if Stage.QUANTIZE in skipped else Recipe.A8W8
        elif Stage.QUANTIZE in skipped and recipe.is_quantized:
            raise ConfigValidationError(
                "pipeline.recipe",
                recipe.value,
                "quantize is skipped, so the model stays float; pick fp32 or fp16",
            )
        if not recipe.is_quantized:
            skipped = skipped | {Stage.QUANTIZE}
        soc = None if soc is None else lookup_soc(soc, "pipeline.soc").name
        q = (
            None
            if Stage.QUANTIZE in skipped
            else _build(QuantizeConfig, "quantize", quantize or {},
                        dict(backend=backend, recipe=recipe, soc=soc))
        )
        prepare = dict(prepare or {})
        if (infer or {}).get("generation") is not None and "kv_cache" not in prepare:
            prepare["kv_cache"] = True  # generating needs the KV-cache export, as --prompt sets
        if not BACKENDS[backend].mutable_buffers and prepare.get("kv_cache") \
                and "kv_io" not in prepare:
            prepare["kv_io"] = True  # no mutable buffers (QNN): the host keeps the cache
        if BACKENDS[backend].llm_custom_ops and prepare.get("kv_cache") \
                and prepare.get("custom_ops") is None:
            # Where the model's attention allows (custom_sdpa computes plain causal attention
            # only): a default must work for every model, so it is not a refusal.
            prepare["custom_ops"] = None
        return cls(
            prepare=_build(PrepareConfig, "prepare", prepare, dict(model=model)),
            quantize=q,
            compile=_build(CompileConfig, "compile", compile or {},
                           dict(backend=backend, recipe=recipe, soc=soc)),
            infer=_build(InferConfig, "infer", infer or {}, {}),
            out_dir=out_dir,
            skip=skipped,
            stop_after=last,
            force=force,
        )

    @property
    def backend(self) -> Backend:
        return self.compile.backend

    @property
    def recipe(self) -> Recipe:
        return self.compile.recipe

    @property
    def soc(self) -> str | None:
        return self.compile.soc


_PIPELINE_KEYS = ("model", "backend", "recipe", "soc", "out", "skip", "stop_after", "force")


Overrides = Mapping[str, Mapping[str, Any]]


def load_pipeline_toml(path: Path, overrides: Overrides | None = None) -> PipelineContext:
    """Load a pipeline config file; `overrides` (e.g. CLI flags) win over the file's values."""
    data = read_toml(path)  # size-bounded, every failure one ConfigValidationError
    return pipeline_from_mapping(data, overrides)


_SECTIONS = ("pipeline", "prepare", "quantize", "compile", "infer")


def pipeline_from_mapping(
    data: Mapping[str, Any], overrides: Overrides | None = None
) -> PipelineContext:
    """Build a PipelineContext from TOML-shaped data (see the module docstring).

    `overrides` has the same shape ({"pipeline": {"backend": ...}, "infer": {"runs": ...}});
    its None values mean "not given" and leave the data's value in place.
    """
    _reject_unknown(data, _SECTIONS, "")
    for name in _SECTIONS:
        if name in data and not isinstance(data[name], Mapping):
            raise ConfigValidationError(name, data[name], "must be a table ([section])")
    merged = {name: dict(data.get(name, {})) for name in _SECTIONS}
    _reject_unknown(overrides or {}, _SECTIONS, "")
    for name, values in (overrides or {}).items():
        merged[name].update({k: v for k, v in values.items() if v is not None})
    top = merged.pop("pipeline")
    _reject_unknown(top, _PIPELINE_KEYS, "pipeline.")
    if "model" not in top:
        raise ConfigValidationError("pipeline.model", None, "required")
    hints = typing.get_type_hints(PipelineContext.create)
    kwargs: dict[str, Any] = {**merged}
    for key, value in top.items():
        name = "out_dir" if key == "out" else key
        kwargs[name] = _coerce(hints[name], value, f"pipeline.{key}")
    return PipelineContext.create(**kwargs)


# Fields the pipeline sets on the stage configs itself; a stage table may not repeat them.
_SHARED_FIELDS = frozenset({"model", "backend", "recipe", "soc"})

C = TypeVar("C")


def _build(cls: type[C], section: str, table: Mapping[str, Any], shared: dict[str, Any]) -> C:
    assert dataclasses.is_dataclass(cls)
    names = tuple(f.name for f in dataclasses.fields(cls) if f.name not in _SHARED_FIELDS)
    for key in table:
        if key in _SHARED_FIELDS:
            raise ConfigValidationError(
                f"{section}.{key}", table[key], f"set it once, under [pipeline] {key} = ..."
            )
    _reject_unknown(table, names, f"{section}.")
    hints = typing.get_type_hints(cls)
    values = {k: _coerce(hints[k], v, f"{section}.{k}") for k, v in table.items()}
    return cls(**values, **shared)


def _reject_unknown(table: Mapping[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigValidationError(f"{prefix}{key}", table[key], "unknown key", allowed)


def _coerce(tp: Any, value: Any, path: str) -> Any:
    """Convert a TOML value to the annotated field type, or say exactly why it can't be."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        # The first member that takes the value (`int | Literal["auto"]`); else the first's error.
        errors: list[ConfigValidationError] = []
        for arg in args:
            try:
                return _coerce(arg, value, path)
            except ConfigValidationError as err:
                errors.append(err)
        named = [a for err in errors[1:] for a in err.allowed or ()]
        if not named:
            raise errors[0]
        raise ConfigValidationError(path, value, f"{errors[0].reason}, or one of: "
                                    + ", ".join(repr(a) for a in named))
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigValidationError(path, value, "is not allowed", tuple(map(str, allowed)))
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        if not isinstance(value, str):
            raise ConfigValidationError(path, value, "must be a string",
                                        tuple(str(m.value) for m in tp))
        try:
            return tp(value.strip().lower())
        except ValueError:
            raise ConfigValidationError(path, value, f"unknown {tp.__name__.lower()}",
                                        tuple(str(m.value) for m in tp)) from None
    if origin is tuple:
        (inner, _) = typing.get_args(tp)  # tuple[X, ...]
        if not isinstance(value, list | tuple):
            raise ConfigValidationError(path, value, "must be a list")
        return tuple(_coerce(inner, v, path) for v in value)
    if origin in (frozenset, Iterable):  # a set of names (`PipelineContext.create`'s skip)
        (inner,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list | tuple | set | frozenset):
            raise ConfigValidationError(path, value, "must be a list")
        return frozenset(_coerce(inner, v, path) for v in value)
    if tp is Path:
        if not isinstance(value, str | Path):
            raise ConfigValidationError(path, value, "must be a path string")
        return Path(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigValidationError(path, value, "must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigValidationError(path, value, "must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigValidationError(path, value, "must be a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigValidationError(path, value, "must be a string")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a table, e.g. infer.generation
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigValidationError(path, value, "must be a table")
        _reject_unknown(value, tuple(f.name for f in dataclasses.fields(tp)), f"{path}.")
        hints = typing.get_type_hints(tp)
        return tp(**{k: _coerce(hints[k], v, f"{path}.{k}") for k, v in value.items()})
    raise TypeError(f"no TOML conversion for {tp!r} at {path}")  # a bug in this module

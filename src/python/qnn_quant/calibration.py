"""The calibration a model's family supplies the quantization engine (`Calibration`):

- `program_calibration`: samples (positional inputs, or `ModelInputs`) through one program,
  each checked against its inputs before any work;
- `causal_lm_calibration`: texts through a causal LM's prefill and decode the way the runtime
  feeds them (`qnn_common.causal_lm.steps.feed`: chunks through prefill, a short tail through
  decode), the state the model updates in place put back between texts (`initial_state`); the
  methods share one set of scales (`shared_scales`), and 8da4w smooths blocks on the first few texts
  (`qnn_quant.smoothed_blocks`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from tqdm import tqdm

from qnn_common.causal_lm.steps import SinkTable, feed, method_steps
from qnn_common.errors import ConfigValidationError
from qnn_common.llm_spec import LlmSpec
from qnn_common.torchio.samples import ModelInputs, as_model_inputs
from qnn_quant.method_modules import module_runner
from qnn_quant.smoothed_blocks import BlockScale
from qnn_quant.smoothing_stats import choose_block_scales

# (modules by method, a label for progress) -> None: runs the calibration data through them.
RunCalibration = Callable[[Mapping[str, torch.nn.Module], str], None]
# (float methods, group size, which linears are 4-bit) -> each smoothed block's factor.
ChooseSmoothing = Callable[
    [dict[str, ExportedProgram], int, Callable[[torch.fx.Node, torch.Tensor], bool]],
    Mapping[str, BlockScale],
]


@dataclass(frozen=True)
class Calibration:
    """What a model's family supplies the engine: how its calibration data runs through the
    methods' modules (`run`, called once per pass: GPTQ's, then the observers'), how many
    samples it holds, the inputs to export a method again with where its program kept none
    (`example`), whether the methods are one program at several shapes that must share scales
    (`shared_scales`: the methods after the first take its observers' statistics), and how a
    causal LM's 8da4w chooses its smoothed blocks (`smoothing`; None: not smoothed)."""

    run: RunCalibration
    samples: int
    example: tuple[torch.Tensor, ...] | None = None
    shared_scales: bool = False
    smoothing: ChooseSmoothing | None = None


def program_calibration(
    ep: ExportedProgram, samples: Sequence[tuple[torch.Tensor, ...] | ModelInputs],
    *, progress: bool = True,
) -> Calibration:
    """`samples` through the one method of `ep`, a copy of each per call (a model that updates
    an input in place must not change them). Raises ConfigValidationError for a sample that
    does not fit the program."""
    checked = _check_calibration(ep, samples) if samples else []

    def run(modules: Mapping[str, torch.nn.Module], desc: str) -> None:
        (module,) = modules.values()
        restore = initial_state(module)
        with torch.no_grad():
            for sample in tqdm(checked, desc=desc, unit="sample", disable=not progress):
                inputs = sample.clone()
                module(*inputs.args, **inputs.kwargs)
        restore()

    return Calibration(
        run, samples=len(checked), example=tuple(checked[0].args) if checked else None,
    )


def causal_lm_calibration(
    spec: LlmSpec, texts: Sequence[torch.Tensor], *,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None, sink: SinkTable | None = None,
    progress: bool = True,
) -> Calibration:
    """`texts` (token sequences) through a causal LM's prefill and decode (`rope`: the rotary
    table of a program whose cache is its inputs and outputs; `sink`: its attention sink's keys
    and values, when it has one)."""

    def run(modules: Mapping[str, torch.nn.Module], desc: str) -> None:
        prefill, decode = method_steps(spec, module_runner(modules, spec), rope, sink)
        restores = [initial_state(module) for module in modules.values()]
        for sequence in tqdm(texts, desc=desc, unit="text", disable=not progress):
            feed(prefill, decode, sequence.tolist(), 0, spec)
            for restore in restores:
                restore()

    def smoothing(
        programs: dict[str, ExportedProgram], group_size: int,
        eligible: Callable[[torch.fx.Node, torch.Tensor], bool],
    ) -> Mapping[str, BlockScale]:
        return choose_block_scales(
            programs, spec=spec, calibration=texts, group_size=group_size, rope=rope,
            eligible=eligible, initial_state=initial_state,
        )

    return Calibration(run, samples=len(texts), shared_scales=True, smoothing=smoothing)


def written_buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The buffers `module`'s graph writes in place, by name: a KV cache, and whatever else the
    model keeps between calls (transformers' sliding-window layers count the tokens they have
    seen in an int64 buffer). Read off the ops' schemas (an argument the op writes), not off the
    buffers' names or dtypes. A module without a graph writes none that can be told."""
    graph = getattr(module, "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        return {}
    written: set[str] = set()
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        # Positional arguments only: an in-place op's written tensor is never keyword-only.
        for argument, value in zip(schema.arguments, node.args, strict=False):
            alias = argument.alias_info
            if alias is not None and alias.is_write and isinstance(value, torch.fx.Node) \
                    and value.op == "get_attr":
                written.add(str(value.target))
    buffers = dict(module.named_buffers())
    return {name: buffers[name] for name in sorted(written) if name in buffers}


def initial_state(module: torch.nn.Module) -> Callable[[], None]:
    """A function that puts back what `module`'s written buffers hold now.

    Calibration runs texts through the program the way the runtime does, so it fills the cache
    and counters; each text must start from the model's own initial state, and the quantized
    program must keep it: the compile serializes a written buffer that is not all zeros as the
    program's initial state (qnn_compile.lower), so a counter left at a calibration text's
    length would start every generation there."""
    buffers = written_buffers(module)
    saved = {name: tensor.clone() for name, tensor in buffers.items()}

    def restore() -> None:
        with torch.no_grad():
            for name, value in saved.items():
                buffers[name].copy_(value)

    return restore


def _input_values(ep: ExportedProgram) -> list[Any] | None:
    """The program's user inputs in order: fake tensors, and constants (int, None, ...) for
    the non-tensor inputs torch.export specialized; None if they cannot be read."""
    from torch.export.graph_signature import ConstantArgument, InputKind

    user_inputs = [s for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    values: list[Any] = []
    for spec in user_inputs:
        if isinstance(spec.arg, ConstantArgument):
            values.append(spec.arg.value)
            continue
        node = placeholders.get(getattr(spec.arg, "name", ""))
        val = node.meta.get("val") if node is not None else None
        if not isinstance(val, torch.Tensor):
            return None
        values.append(val)
    return values


def _check_calibration(
    ep: ExportedProgram, calibration: Sequence[tuple[torch.Tensor, ...] | ModelInputs]
) -> list[ModelInputs]:
    """The samples as ModelInputs, each checked against the program's flat user inputs (the
    pytree leaves of its args and kwargs; constants are checked by the program's own guards)."""
    field = "calibration"
    samples = [as_model_inputs(s) for s in calibration]
    if not samples:
        raise ConfigValidationError(field, 0, "need at least one calibration sample")
    specs = _input_values(ep)
    if specs is None:
        return samples
    for i, sample in enumerate(samples):
        leaves = sample.leaves()
        if len(leaves) != len(specs):
            raise ConfigValidationError(
                field, f"sample {i}",
                f"has {len(leaves)} inputs (pytree leaves of its args and kwargs), the program "
                f"takes {len(specs)}",
            )
        for j, (got, want) in enumerate(zip(leaves, specs, strict=True)):
            if not isinstance(want, torch.Tensor):
                continue
            if not isinstance(got, torch.Tensor):
                raise ConfigValidationError(
                    field, f"sample {i} input {j}", f"expected a tensor, got {got!r}"
                )
            if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
                raise ConfigValidationError(
                    field,
                    f"sample {i} input {j}",
                    f"expected {want.dtype} {list(want.shape)}, "
                    f"got {got.dtype} {list(got.shape)}",
                )
    return samples

"""The export flow every single-method task shares: one forward, its samples, its fp32 reference.

Image, text-encoder, logits-only causal LM and a user's factory differ only in how they load a
`LoadedModel`; from there the program, calibration, eval inputs and reference are made the same
way (`export_single`). `SingleMethodTask` makes a loader a `Task`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from qnn_common.config import PrepareConfig
from qnn_common.stages import DEFAULT_METHOD, TOKENIZER_DIR
from qnn_common.torchio.program_state import initial_buffers_kept
from qnn_common.torchio.samples import ModelInputs, Sample, flatten_outputs
from qnn_prepare.calibration import calibration_summary, make_inputs
from qnn_prepare.task import LoadedModel, TaskExport, export_program

log = logging.getLogger(__name__)


def export_single(model: LoadedModel, config: PrepareConfig, load_s: float) -> TaskExport:
    """Export `model` as the one method ``forward`` with calibration, eval inputs (the example
    first, then held-out samples drawn with another seed) and the fp32 reference outputs."""
    timings = {"load_s": load_s}
    t = time.perf_counter()
    program = export_program(model)
    timings["export_s"] = time.perf_counter() - t
    log.info("exported %s in %.1f s", model.name, timings["export_s"])

    calibration = make_inputs(
        model, num_samples=config.calibration_samples, source=config.calibration_file,
        seed=config.seed,
    )
    extra = config.eval_samples - 1
    eval_inputs = [model.example]
    if extra:
        eval_inputs += make_inputs(
            model, num_samples=extra, source=None, seed=config.seed + 1, include_example=False
        )

    t = time.perf_counter()
    module = program.module()
    # initial_buffers_kept: a model that updates a buffer in place must be saved as registered.
    with torch.no_grad(), initial_buffers_kept(program):
        # On copies: a model that updates its inputs in place would otherwise change the eval
        # inputs saved with the artifact (which would then hold f(x), not x).
        reference = [_call(module, sample) for sample in eval_inputs]
    timings["reference_s"] = time.perf_counter() - t

    example = model.example
    metrics = {
        "model": model.name,
        "input_names": list(model.input_names),
        "output_names": list(model.output_names),
        "input_shapes": [
            {"shape": list(x.shape), "dtype": str(x.dtype)}
            if isinstance(x, torch.Tensor)
            else {"value": x}
            for x in example.leaves()
        ],
        # What the program's flat inputs (above, in order) are the leaves of.
        **({} if example.is_flat() else {"input_structure": example.describe()}),
        "parameters": sum(p.numel() for p in model.module.parameters()),
        "calibration_samples": len(calibration),
        "eval_samples": len(eval_inputs),
        "calibration": calibration_summary(model, calibration, config.calibration_file),
    }
    return TaskExport(
        name=model.name,
        kind=model.kind,
        programs={DEFAULT_METHOD: program},
        calibration=calibration,
        eval_inputs=eval_inputs,
        reference=reference,
        files={f"{TOKENIZER_DIR}/{f.name}": f.read_bytes() for f in model.tokenizer_files},
        timings=timings,
        metrics=metrics,
    )


def _call(module: torch.nn.Module, sample: ModelInputs) -> Sample:
    """`module` on a copy of `sample`, its outputs flattened."""
    inputs = sample.clone()
    return flatten_outputs(module(*inputs.args, **inputs.kwargs))


@dataclass(frozen=True)
class SingleMethodTask:
    """A `Task` from a loader: `load(spec, seq_len, seed)` -> `LoadedModel`, exported by
    `export_single`."""

    name: str
    accepts_spec: Callable[[str], bool]
    load: Callable[[str, int, int], LoadedModel]
    builtin_models: Mapping[str, str] = field(default_factory=dict)

    def builtins(self) -> Mapping[str, str]:
        """Built-in model names of this task, with a description each."""
        return self.builtin_models

    def accepts(self, spec: str, config: PrepareConfig) -> bool:
        """Whether `spec` is this task's (a single-method export never has a KV cache)."""
        return not config.kv_cache and self.accepts_spec(spec)

    def builtin_weights(self, spec: str) -> bytes | None:
        """None: these built-ins are seeded or fixed by this package's code (its version is in
        the cache key)."""
        return None

    def export(self, config: PrepareConfig) -> TaskExport:
        """Load `config.model` and export it."""
        t = time.perf_counter()
        model = self.load(config.model.strip(), config.seq_len, config.seed)
        load_s = time.perf_counter() - t
        log.info("loaded %s (%s, %d inputs)", model.name, model.kind, len(model.example_inputs))
        return export_single(model, config, load_s)

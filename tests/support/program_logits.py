"""A compiled causal LM's logits, run on the host (the HTP emulator for a QNN program)."""

from __future__ import annotations

from pathlib import Path

import torch

from qnn_common.config import Stage
from qnn_common.llm import teacher_forced_logits
from qnn_common.manifest import load_manifest
from qnn_common.stages import EVAL_INPUTS, PTE, llm_spec_of, rope_of
from qnn_common.tensorio import load_samples
from qnn_infer.generate import PteLm
from qnn_infer.runtimes import delegates_in, prepare_runtime


def teacher_forced(compiled: Path) -> list[torch.Tensor]:
    """The program's logits on its eval texts, prefill then decode as generation calls them."""
    manifest = load_manifest(compiled, expect_stage=Stage.COMPILE)
    spec = llm_spec_of(compiled, manifest)
    assert spec is not None, f"{compiled} holds no causal LM"
    prepare_runtime(delegates_in(compiled / PTE))  # the QNN SDK, before the program loads
    lm = PteLm(compiled / PTE, spec, rope_of(compiled, manifest))
    texts = [sample[0] for sample in load_samples(compiled / EVAL_INPUTS)]
    return teacher_forced_logits(lm.prefill, lm.decode, texts, spec)

"""The causal LM's checks of a whole run: generation, the prompt and sharding need the KV-cache
export, and the prompt must fit its context. Only a run that starts at prepare is checked: a
resumed one has its export already, which the stages downstream check themselves."""

from __future__ import annotations

from qnn_common.config import Stage
from qnn_common.errors import ConfigValidationError
from qnn_pipeline.context import PipelineContext
from qnn_prepare.causal_lm.export import check_prompt_fits


def preflight(ctx: PipelineContext, first: Stage) -> None:
    """Refuse a prompt without a KV cache or too long for the context, and sharding without a
    KV-cache export."""
    if first is not Stage.PREPARE:
        return
    generation = ctx.infer.generation
    if generation is not None and not ctx.prepare.kv_cache:
        # Without a KV cache the program is a plain forward: the prompt would be dropped, and
        # the run would exit 0 as if it had generated.
        raise ConfigValidationError(
            "infer.generation", {"prompt": generation.prompt[:40]},
            "generation needs a causal LM exported with a KV cache, and prepare.kv_cache is "
            "off: set `kv_cache = true` under [prepare] (what --prompt does), or remove "
            "[infer.generation]",
        )
    if ctx.prepare.kv_cache and generation is not None:
        # A prompt the context cannot hold is refused before minutes of export and lowering.
        check_prompt_fits(
            ctx.prepare.model, max_seq_len=ctx.prepare.max_seq_len,
            prefill_len=ctx.prepare.prefill_len, prompt=generation.prompt,
            max_new_tokens=generation.max_new_tokens,
        )
    if ctx.compile.num_shards != 1 and not ctx.prepare.kv_cache:
        raise ConfigValidationError(
            "compile.num_shards", ctx.compile.num_shards,
            "sharding splits a causal LM's decoder layers, exported with its KV cache: add "
            "--prompt (kv_cache = true under [prepare]), or drop --num-shards",
        )

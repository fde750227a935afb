"""A static-cache LM's methods run as the .pte runs them: decode reads what prefill wrote."""

from __future__ import annotations

import torch
from torch import nn

from qnn_common.llm_spec import DECODE, PREFILL, LlmSpec
from qnn_quant.method_modules import lm_modules, module_runner

VOCAB, HIDDEN, PREFILL_LEN, CONTEXT = 32, 8, 4, 8
SPEC = LlmSpec(max_seq_len=CONTEXT, prefill_len=PREFILL_LEN, vocab_size=VOCAB)


class CachedLm(nn.Module):
    """Each position's logits come from the sum of every embedding cached so far: a decode
    step that reads an empty cache gives logits of its own token alone."""

    k_cache: torch.Tensor
    rope_table: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.register_buffer("k_cache", torch.zeros(CONTEXT, HIDDEN))
        self.register_buffer("rope_table", torch.ones(CONTEXT, HIDDEN))

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        self.k_cache.index_copy_(0, cache_position, self.embed(input_ids)[0])
        seen = (torch.arange(CONTEXT)[None, :] <= cache_position[:, None]).float()
        out: torch.Tensor = self.head((seen @ (self.k_cache * self.rope_table))[None])
        return out


def _programs() -> dict[str, torch.export.ExportedProgram]:
    """Each method exported from a module of its own, as methods loaded from their files are."""
    return {
        method: torch.export.export(CachedLm().eval(), (), {
            "input_ids": torch.zeros(1, n, dtype=torch.int64),
            "cache_position": torch.arange(n),
        }, strict=False)
        for method, n in ((PREFILL, PREFILL_LEN), (DECODE, 1))
    }


def _prefill_then_decode(run: object) -> torch.Tensor:
    assert callable(run)
    prompt = torch.arange(1, PREFILL_LEN + 1)[None]
    with torch.no_grad():
        run(PREFILL, [prompt, torch.arange(PREFILL_LEN)])
        out: torch.Tensor = run(DECODE, [torch.tensor([[7]]), torch.tensor([PREFILL_LEN])])[0]
    return out


def test_decode_reads_the_cache_prefill_wrote() -> None:
    eager = CachedLm().eval()
    programs = _programs()
    want = _prefill_then_decode(lambda method, inputs: [eager(*inputs)])
    modules = lm_modules(programs, torch.export.ExportedProgram.module)
    got = _prefill_then_decode(module_runner(modules, SPEC))
    torch.testing.assert_close(got, want)
    # Only the written buffer is shared: the constant table stays each method's own.
    assert modules[DECODE].get_buffer("k_cache") is modules[PREFILL].get_buffer("k_cache")
    assert modules[DECODE].get_buffer("rope_table") is not modules[PREFILL].get_buffer(
        "rope_table")


def test_methods_made_apart_would_not() -> None:
    """What `lm_modules` mends: each module built on its own holds its own cache."""
    eager = CachedLm().eval()
    programs = _programs()
    want = _prefill_then_decode(lambda method, inputs: [eager(*inputs)])
    apart = {method: program.module() for method, program in programs.items()}
    got = _prefill_then_decode(module_runner(apart, SPEC))
    assert not torch.allclose(got, want)

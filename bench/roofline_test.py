"""The roofline's parts: the host probe measures something real, a program's cost is counted
exactly on small modules, and the bound picks the slower of memory and compute."""

from __future__ import annotations

import pytest
import torch
from roofline import Cost, HostPeaks, decode_cost, inference_cost, probe_host, roofline
from torch import nn

from qnn_common.recipes import Recipe


class _Tagger(nn.Module):
    """An embedding, then two linears: the shape of a tiny text model."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 64)
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(torch.relu(self.up(self.embed(ids))))
        return out


def test_the_probe_measures_this_host_and_restores_the_thread_count() -> None:
    before = torch.get_num_threads()
    peaks = probe_host(1, read_mib=16, gemm=128, repeats=2)
    assert torch.get_num_threads() == before
    assert peaks.threads == 1
    assert peaks.read_gb_s > 0 and peaks.fp32_gmac_s > 0
    assert peaks.int8_gmac_s is None or peaks.int8_gmac_s > 0
    assert set(peaks.to_json()) == {"threads", "read_gb_s", "fp32_gmac_s", "int8_gmac_s"}


def test_an_inference_counts_its_macs_and_the_rows_it_looked_up() -> None:
    model = _Tagger().eval()
    ids = torch.randint(0, 100, (1, 10))
    fp32 = inference_cost(model, (ids,), Recipe.FP32)
    # 10 tokens through 64x128 and 128x64: 2 * 10 * 8192 MACs.
    assert fp32.macs == 2 * 10 * 64 * 128
    # 10 embedding rows, both weights and up's bias in fp32.
    assert fp32.bytes_read == 10 * 64 * 4 + 2 * 64 * 128 * 4 + 128 * 4
    # 8-bit weights: a byte each and an fp32 scale per output channel; the rest as before.
    a8w8 = inference_cost(model, (ids,), Recipe.A8W8)
    assert a8w8.bytes_read == 10 * 64 * 4 + 2 * 64 * 128 + (128 + 64) * 4 + 128 * 4
    # 4-bit weights in groups of 32: half a byte each, a bf16 scale per group.
    a8dw4 = inference_cost(model, (ids,), Recipe.A8DW4, group_size=32)
    assert a8dw4.bytes_read == 10 * 64 * 4 + 64 * 128 + 2 * 64 * 128 // 32 * 2 + 128 * 4


def test_a_decode_step_reads_every_linear_one_row_and_its_cache() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    cost = decode_cost(model, Recipe.FP32, context=16)
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    head_dim = 64 // 4
    kv = 2 * 2 * 16 * 2 * head_dim * 4  # k and v, 2 layers, 16 tokens, 2 kv heads, fp32
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert cost.macs == linear_weights + 2 * 2 * 4 * head_dim * 16
    assert cost.bytes_read == 4 * (linear_weights + 64 + norms) + kv
    # 8da4w: 4-bit groups of 32 with a bf16 scale each, but the head at 8 bits per channel, as
    # the quantize stage keeps it (int8_weights' default).
    head = model.lm_head.weight.numel()
    rest = linear_weights - head
    a8dw4 = decode_cost(model, Recipe.A8DW4, context=16, group_size=32)
    assert a8dw4.bytes_read == (rest // 2 + rest // 32 * 2 + head + 100 * 4
                                + 4 * (64 + norms) + kv)


def test_the_bound_is_the_slower_of_memory_and_compute() -> None:
    peaks = HostPeaks(threads=2, read_gb_s=10.0, fp32_gmac_s=50.0, int8_gmac_s=200.0)
    # 100 MB at 10 GB/s: 10 ms; 1 GMAC: 20 ms in fp32, 5 ms in int8.
    cost = Cost(macs=10**9, bytes_read=10**8)
    fp32 = roofline(cost, peaks, Recipe.FP32, measured_ms=40.0)
    assert fp32["bound"] == "compute" and fp32["peak"] == "fp32"
    assert fp32["compute_ms"] == pytest.approx(20.0) and fp32["fraction"] == pytest.approx(0.5)
    int8 = roofline(cost, peaks, Recipe.A8W8, measured_ms=40.0)
    assert int8["bound"] == "memory" and int8["peak"] == "int8"
    assert int8["fraction"] == pytest.approx(0.25)
    # 16-bit activations do not run as int8 GEMMs; without an int8 probe, fp32's peak applies.
    assert roofline(cost, peaks, Recipe.A16W8, 40.0)["peak"] == "fp32"
    no_int8 = HostPeaks(threads=2, read_gb_s=10.0, fp32_gmac_s=50.0, int8_gmac_s=None)
    assert roofline(cost, no_int8, Recipe.A8DW4, 40.0)["peak"] == "fp32"

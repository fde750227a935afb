"""The llama.cpp scorer (`llama_cpp_peer.py --serve-logits`, what eval_peer.py drives) on a tiny
GGUF this test writes with the `gguf` package: every window's logits are llama.cpp's for that
window alone, and the first position's are the model's, computed here in numpy.

Needs an interpreter with llama-cpp-python (a bench-only dependency whose sdist compiles
llama.cpp): set LLAMA_CPP_PYTHON to it; skipped, with that reason, otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

PEER = Path(__file__).with_name("llama_cpp_peer.py")
EMBED, FFN, HEADS, EPS = 64, 128, 4, 1e-5
BYTES = [f"<0x{b:02X}>" for b in range(256)]
TOKENS = ["<unk>", "<s>", "</s>", *BYTES, "▁a", "▁b", "▁c", "▁d"]


def _python() -> str:
    # A skip at run time, not a skipif marker: finding out whether the interpreter imports
    # llama_cpp takes a subprocess, which collection (import time) should not start.
    python = os.environ.get("LLAMA_CPP_PYTHON")
    if not python:
        pytest.skip("set LLAMA_CPP_PYTHON to an interpreter with llama-cpp-python (a bench "
                    "dependency: its sdist compiles llama.cpp, see docs/llm.md)")
    found = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True, check=False)
    if found.returncode != 0:
        pytest.skip(f"LLAMA_CPP_PYTHON={python} cannot import llama_cpp: "
                    f"{found.stderr.decode()[-300:]}")
    return python


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def draw(*shape: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    vocab = len(TOKENS)
    return {
        "token_embd.weight": draw(vocab, EMBED, scale=1.0),
        "blk.0.attn_norm.weight": 1 + draw(EMBED),
        "blk.0.attn_q.weight": draw(EMBED, EMBED),
        "blk.0.attn_k.weight": draw(EMBED, EMBED),
        "blk.0.attn_v.weight": draw(EMBED, EMBED),
        "blk.0.attn_output.weight": draw(EMBED, EMBED),
        "blk.0.ffn_norm.weight": 1 + draw(EMBED),
        "blk.0.ffn_gate.weight": draw(FFN, EMBED),
        "blk.0.ffn_up.weight": draw(FFN, EMBED),
        "blk.0.ffn_down.weight": draw(EMBED, FFN),
        "output_norm.weight": 1 + draw(EMBED),
        "output.weight": draw(vocab, EMBED, scale=0.5),
    }


def write_tiny_llama(path: Path, weights: dict[str, np.ndarray]) -> None:
    """A one-block llama-architecture GGUF in float32, with a byte-fallback SentencePiece
    vocabulary (llama.cpp looks up a newline's byte token when it loads one)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(EMBED)
    writer.add_block_count(1)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(EMBED // HEADS)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.0] * len(TOKENS))
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.BYTE] * len(BYTES) + [gguf.TokenType.NORMAL] * 4)
    writer.add_token_types([int(t) for t in types])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, tensor in weights.items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _rms(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    return np.asarray(x / np.sqrt(np.mean(x * x) + EPS) * weight)


def first_position_logits(w: dict[str, np.ndarray], token: int) -> np.ndarray:
    """The model's logits at position 0, where attention reads one key (its own): softmax of
    one score is 1 and the rotation at position 0 is the identity, so attention is Wo Wv x."""
    f = {k: v.astype(np.float64) for k, v in w.items()}
    x = f["token_embd.weight"][token]
    x = x + f["blk.0.attn_output.weight"] @ (
        f["blk.0.attn_v.weight"] @ _rms(x, f["blk.0.attn_norm.weight"]))
    h = _rms(x, f["blk.0.ffn_norm.weight"])
    gate = f["blk.0.ffn_gate.weight"] @ h
    silu = gate / (1 + np.exp(-gate))
    x = x + f["blk.0.ffn_down.weight"] @ (silu * (f["blk.0.ffn_up.weight"] @ h))
    return np.asarray(f["output.weight"] @ _rms(x, f["output_norm.weight"]))


def _score(python: str, gguf_file: Path, windows: list[list[int]], tmp: Path
           ) -> list[np.ndarray]:
    requests = "".join(json.dumps({"ids": ids, "out": str(tmp / f"w{i}.npy")}) + "\n"
                       for i, ids in enumerate(windows))
    done = subprocess.run(
        [python, str(PEER), str(gguf_file), "--serve-logits", "--threads", "1", "--n-ctx", "64",
         "--batch", "64"],
        input=requests, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ready"] + ["ok"] * len(windows), done.stdout
    return [np.load(tmp / f"w{i}.npy") for i in range(len(windows))]


def test_the_scorer_gives_each_windows_own_logits(tmp_path: Path) -> None:
    python = _python()
    weights = _weights(seed=1126)
    model = tmp_path / "tiny.gguf"
    write_tiny_llama(model, weights)
    # Ids of TOKENS: byte tokens (3 + byte) and two words (260, 261).
    first, again, short = _score(
        python, model, [[5, 260, 40, 77, 261, 9], [5, 260, 40, 77, 261, 9], [5, 260, 40]],
        tmp_path)
    assert first.shape == (6, len(TOKENS)) and first.dtype == np.float32
    want = first_position_logits(weights, 5)
    assert np.abs(first[0] - want).max() < 1e-3 * np.abs(want).max(), (first[0][:5], want[:5])
    # Each request starts from an empty cache: the same window scores the same, and a window's
    # first positions do not depend on what follows them.
    np.testing.assert_allclose(again, first, rtol=0, atol=1e-4)
    np.testing.assert_allclose(short, first[:3], rtol=0, atol=1e-4)
    # Later positions read earlier tokens: position 1's logits are not its token's alone.
    alone = first_position_logits(weights, 260)
    assert np.abs(first[1] - alone).max() > 1e-2

"""The causal-LM task: decoders exported as prefill + decode over a KV cache (docs/llm.md)."""

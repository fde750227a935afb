"""Stage 2: post-training quantization (PT2E) with an accuracy report per output and per layer."""

__version__ = "0.1.0"

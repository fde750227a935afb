"""Stage 1: load a model (built-in, Hugging Face directory, or your function) and export it."""

__version__ = "0.1.0"

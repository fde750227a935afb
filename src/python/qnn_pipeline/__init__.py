"""The orchestrator: prepare -> quantize -> compile -> infer, with caching and resume."""

__version__ = "0.1.0"

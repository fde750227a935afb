"""Stage 3: lower an exported program to an ExecuTorch .pte for one backend."""

__version__ = "0.1.0"

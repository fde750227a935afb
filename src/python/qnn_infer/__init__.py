"""Stage 4: run a .pte, compare it with its references, and time it."""

__version__ = "0.1.0"

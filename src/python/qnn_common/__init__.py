"""Shared contracts of the QNN / ExecuTorch pipeline: configs, SoCs, recipes, errors, manifests."""

__version__ = "0.1.0"

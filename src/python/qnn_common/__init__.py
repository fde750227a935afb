"""Shared contracts of the QNN / ExecuTorch pipeline: configs, SoCs, recipes, errors, manifests.

The modules at this level are the contracts and need only the standard library (bar `llm`,
`metrics` and `stages`, which carry tensors). Beside them: `store` (atomic writes, hashes, locks,
staging), `torchio` (sample and program files, foreign ones read safely), `cli` (what every CLI
shares) and `qnn_sdk` (the QNN SDK and its x86 bridge).
"""

__version__ = "0.1.0"

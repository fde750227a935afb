"""Torch files in and out, foreign ones included, without running code from them.

What this package changes in torch, all of it in torch.export's loader (each pinned by the test
named; indexed with the upstream version it was read against in `qnn_common.upstream_patches`,
part of the one index `qnn_compile.upstream_patches.PATCHES`):
- `serde_speed`: `torch._export.serde.serialize`'s `typing` name, for the process once installed,
  so the serde schema's type hints are computed once per class (`serde_speed_test`).
- `known_weights`: `torch.export.pt2_archive._package._build_file_map`, only inside one
  `load_program(..., known=...)`, so a method's weights equal to another loaded method's are
  that method's storage, not a copy (`known_weights_test`; off, with a warning, if torch moves it).
"""

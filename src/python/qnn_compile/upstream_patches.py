"""Every torch and ExecuTorch attribute the pipeline replaces, in one index: qnn_common's
(`qnn_common.upstream_patches.PATCHES`, torch.export's loader) and qnn_compile's, which it
replaces while it lowers.

Each of qnn_compile's replacements is a `ScopedPatch` held by one module (its `_PATCH`), in place
only while a lowering runs (scoped_patch.py). This index says what each replaces, why, which
upstream it was written against, and which test pins what it must keep doing.
`upstream_patches_test.py` holds the index to the code (every ScopedPatch listed, with exactly the
attributes it replaces; every attribute listed still upstream) and to the installed packages: a
torch or ExecuTorch upgrade fails it until each patch has been read again against the new
upstream code and `WRITTEN_FOR` moved.

Not listed, since it changes no upstream behaviour: `progress.logging_partitions` wraps a
backend's `preprocess` to log each partition compiled.
"""

from __future__ import annotations

from qnn_common.upstream_patches import PATCHES as COMMON_PATCHES
from qnn_common.upstream_patches import WRITTEN_FOR as WRITTEN_FOR  # one pin for every patch
from qnn_common.upstream_patches import UpstreamPatch as UpstreamPatch

PATCHES = (
    *COMMON_PATCHES,
    UpstreamPatch(
        "qnn_compile.cia_ops",
        frozenset({
            "torch._export.utils._materialize_cpp_cia_ops",
            "torch._export.utils._collect_all_valid_cia_ops",
            "torch.export.exported_program._collect_all_valid_cia_ops",
            "torch.export.decomp_utils._collect_all_valid_cia_ops",
        }),
        "the preservable CIA ops are collected once per lowering, not walked from every op "
        "namespace by each run_decompositions and decomposition table",
        "src/python/qnn_compile/cia_ops_test.py",
    ),
    UpstreamPatch(
        "qnn_compile.context_cache",
        frozenset({"executorch.backends.qualcomm.qnn_preprocess.QnnBackend"
                   ".preprocess_multimethod"}),
        "HTP contexts built one partition and method at a time and kept by what they are built "
        "from: a killed compile resumes, and one method's graphs are built at a time",
        "tests/qnn/qnn_context_cache_test.py",
    ),
    UpstreamPatch(
        "qnn_compile.node_sources",
        frozenset(),
        "each pass that deep-copies a graph shares the nodes' provenance records instead of "
        "copying every node's whole history (left alone if torch defines the copy itself)",
        "src/python/qnn_compile/node_sources_test.py",
        adds=frozenset({"torch.fx.traceback.NodeSource.__deepcopy__"}),
    ),
    UpstreamPatch(
        "qnn_compile.partition_legalize",
        frozenset({"executorch.exir.lowered_backend_module.legalize_graph"}),
        "the topological re-sort after each partition cut moves nodes instead of copying the "
        "whole program once per partition",
        "src/python/qnn_compile/partition_legalize_test.py",
    ),
    UpstreamPatch(
        "qnn_compile.partition_merge",
        frozenset({
            "executorch.exir.backend.canonical_partitioners.group_partitioner"
            ".GroupBasedPartitioner._merge_partitions",
            "executorch.exir.backend.canonical_partitioners.group_partitioner"
            "._DependencyViewer",
        }),
        "XNNPACK's partition merge costs what the graph costs, not its cube (SmolLM2's compile "
        "spent most of an hour there)",
        "src/python/qnn_compile/partition_merge_test.py",
    ),
    UpstreamPatch(
        "qnn_compile.partition_recompile",
        frozenset({"executorch.exir.backend.backend_api._create_partitions_in_graph_module"}),
        "the program's code is generated once after all partitions are cut, not once per cut",
        "tests/llm/fast_partitioning_test.py",
    ),
    UpstreamPatch(
        "qnn_compile.shared_constants",
        frozenset({"executorch.backends.qualcomm.qnn_preprocess.QnnBackend"
                   ".copy_exported_program_for_preprocess",
                   "executorch.backends.xnnpack.xnnpack_preprocess.XnnpackBackend"
                   ".copy_exported_program_for_preprocess"}),
        "the partitions QNN and XNNPACK preprocess share the program's weights instead of a deep "
        "copy of all of them at the compile's peak",
        "tests/qnn/qnn_shared_weights_test.py",
    ),
    UpstreamPatch(
        "qnn_compile.xnnpack_passes",
        frozenset({"executorch.backends.xnnpack.xnnpack_preprocess.XNNPACKPassManager"}),
        "XNNPACK's per-partition passes that have nothing to match are skipped (each retraced "
        "every partition on fake tensors)",
        "tests/llm/fast_partitioning_test.py",
    ),
)

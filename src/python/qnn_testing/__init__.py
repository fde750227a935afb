"""Test support for the operator suite: the case catalogue, composable output checks, structural
checks, the target x precision matrix and the coverage table.

Imports qnn_common and third-party code only (see BUILD), so any suite can use it without
pulling in a stage; the stage calls live with the tests (tests/op/harness.py).
"""

__version__ = "0.1.0"

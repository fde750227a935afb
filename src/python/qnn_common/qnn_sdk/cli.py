"""`qnn-sdk-setup`: assemble the x86 dev QNN SDK ahead of time and print where it is."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from qnn_common.cli.support import add_logging_args, run_cli, setup_logging
from qnn_common.qnn_sdk.compat import check_compatible
from qnn_common.qnn_sdk.sdk import find_qnn_sdk


def _main(argv: Sequence[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="qnn-sdk-setup",
        description=(
            "Find the QNN SDK ExecuTorch will use: QNN_SDK_ROOT if set, else the project's x86 "
            "dev SDK (QNN 2.51 from onnxruntime-qnn, bridged for ExecuTorch 1.5.1), assembled "
            "on first use. Checks that ExecuTorch can drive it and prints where it is."
        ),
        epilog="Other tools: export QNN_SDK_ROOT=$(qnn-sdk-setup --print-root)",
    )
    parser.add_argument(
        "--print-root", action="store_true", help="print only the SDK root (for QNN_SDK_ROOT)"
    )
    add_logging_args(parser)
    args = parser.parse_args(argv)
    setup_logging(args.verbose, args.quiet or args.print_root)
    sdk = find_qnn_sdk(assemble=True)
    check_compatible(sdk)
    if args.print_root:
        print(sdk.root)
        return 0
    build = f", build {sdk.build_id}" if sdk.build_id else ""
    print(f"root:    {sdk.root}")
    print(
        f"version: QNN {sdk.qnn_version} (core API {sdk.core_api_version}, backend API "
        f"{sdk.backend_api_version}{build})"
    )
    bridge = "yes (a stand-in libQnnHtp.so in front of the real one)" if sdk.bridged else "no"
    print(f"bridged: {bridge}")
    print(f"source:  {sdk.source}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`qnn-sdk-setup`: assemble the dev QNN SDK if needed; print its root, version and source."""
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m qnn_common.qnn_sdk`: the same as `qnn-sdk-setup`."""

import sys

from qnn_common.qnn_sdk.cli import main

sys.exit(main())

"""activate() in a fresh process: after torch, the SDK's libraries loaded, no switching."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from qnn_common.qnn_sdk import QnnSdk


def test_activate_in_a_fresh_process(dev_sdk: QnnSdk, child_env: dict[str, str]) -> None:
    script = textwrap.dedent(
        """
        import dataclasses, os, sys
        from pathlib import Path
        from qnn_common.errors import BackendNotAvailableError
        from qnn_common.qnn_sdk import activate, find_qnn_sdk
        sdk = find_qnn_sdk(assemble=False)
        assert "torch" not in sys.modules
        activate(sdk)
        activate(sdk)  # idempotent
        assert os.environ["QNN_SDK_ROOT"] == str(sdk.root)
        assert "torch" in sys.modules and "executorch.runtime" in sys.modules
        maps = Path("/proc/self/maps").read_text()
        for name in ("libQnnHtp.so", "libQnnSystem.so"):
            assert str(sdk.lib_dir / name) in maps, name
        try:
            activate(dataclasses.replace(sdk, root=Path("/elsewhere")))
        except BackendNotAvailableError as err:
            assert "cannot switch" in str(err), err
        else:
            raise AssertionError("switching SDKs was allowed")
        # ExecuTorch's own AOT path loads the bridge by full path and reads the build id through it.
        from executorch.backends.qualcomm.utils.check_qnn_version import get_sdk_build_id
        print("BUILD_ID=" + get_sdk_build_id())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    # QNN writes its own lines to stdout (C stdio, flushed at exit), so look for ours.
    assert f"BUILD_ID={dev_sdk.build_id}" in result.stdout.splitlines(), result.stdout

"""The version probe: what the dev SDK's libraries report, and which library serves what."""

from __future__ import annotations

import json

from qnn_common.qnn_sdk import QnnSdk
from qnn_common.qnn_sdk.assemble import MARKER
from qnn_common.qnn_sdk.layout import HTP_LIB, REAL_HTP_LIB
from qnn_common.qnn_sdk.probe import is_bridged, probe_libraries, qnn_version


def test_probe_tells_the_bridge_from_the_real_library(dev_sdk: QnnSdk) -> None:
    probe = probe_libraries(dev_sdk.lib_dir)
    assert probe["device_create_owner"].endswith("/" + HTP_LIB)
    assert probe["build_id_owner"].endswith("/" + REAL_HTP_LIB)
    assert is_bridged(probe)
    assert not is_bridged({**probe, "device_create_owner": probe["build_id_owner"]})
    assert qnn_version(probe) == dev_sdk.qnn_version
    # What the assembly recorded, from the same libraries before they were moved into place.
    marker = json.loads((dev_sdk.root / MARKER).read_text())
    assert marker["probe"]["device_create_owner"].endswith("/" + HTP_LIB)
    assert marker["probe"]["build_id_owner"].endswith("/" + REAL_HTP_LIB)


def test_qnn_version_without_a_build_id_comes_from_the_backend_api() -> None:
    assert qnn_version({"build_id": "v2.51.0.250822", "backend_api": [5, 51, 0]}) == "2.51.0"
    assert qnn_version({"build_id": "", "backend_api": [5, 42, 0]}) == "2.42"

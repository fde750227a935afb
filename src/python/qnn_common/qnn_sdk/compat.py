"""Whether ExecuTorch 1.5.1 can drive a QNN SDK: refuse the version skew it cannot survive."""

from __future__ import annotations

import logging
import re

from qnn_common.errors import BackendNotAvailableError
from qnn_common.qnn_sdk.dev_package import DEV_DISTRIBUTION, DEV_DISTRIBUTION_VERSION
from qnn_common.qnn_sdk.sdk import QnnSdk
from qnn_common.qnn_sdk.versions import (
    CUSTOM_CONFIG_LAYOUT_CHANGED,
    EXECUTORCH_QNN_VERSION,
    EXECUTORCH_VERSION,
    version_text,
)

log = logging.getLogger(__name__)


def _parse_version(text: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_compatible(sdk: QnnSdk) -> None:
    """Refuse an SDK that ExecuTorch 1.5.1 cannot drive, with the reason and the way out.

    Unbridged QNN >= 2.47 would fail deep inside the library (HTP device creation, error 14001),
    so it is refused here; 2.38 to 2.46 and anything older than 2.37 only warn (untested).
    """
    version = _parse_version(sdk.qnn_version)
    built = version_text(EXECUTORCH_QNN_VERSION)
    if version is None:
        log.warning(
            "cannot tell the QNN version of the SDK at %s (%r); ExecuTorch %s expects QNN %s",
            sdk.root,
            sdk.qnn_version,
            EXECUTORCH_VERSION,
            built,
        )
        return
    if sdk.bridged:
        if version < CUSTOM_CONFIG_LAYOUT_CHANGED:
            raise BackendNotAvailableError(
                f"the QNN dev SDK at {sdk.root} is QNN {sdk.qnn_version}, but its bridge writes "
                f"the HTP device config layout of QNN {version_text(CUSTOM_CONFIG_LAYOUT_CHANGED)}"
                f"+: install {DEV_DISTRIBUTION}=={DEV_DISTRIBUTION_VERSION} (QNN 2.51) and run "
                "`qnn-sdk-setup`"
            )
        return
    if version >= CUSTOM_CONFIG_LAYOUT_CHANGED:
        raise BackendNotAvailableError(
            f"the QNN SDK at {sdk.root} is QNN {sdk.qnn_version} (core API "
            f"{sdk.core_api_version}), but ExecuTorch {EXECUTORCH_VERSION} was built against QNN "
            f"{built} (core API 2.27). Between QNN {built} and "
            f"{version_text(CUSTOM_CONFIG_LAYOUT_CHANGED)} the HTP device custom config "
            "(QnnHtpDevice_CustomConfig_t) changed layout, so creating the HTP device would fail "
            "inside the library ('unknown custom config socModel 0', error 14001). Either point "
            f"QNN_SDK_ROOT at a QNN {built}.x SDK (QAIRT {built}), or unset QNN_SDK_ROOT to use "
            "the project's bridged x86 dev SDK (`qnn-sdk-setup` assembles it)"
        )
    if version > EXECUTORCH_QNN_VERSION:
        log.warning(
            "the QNN SDK at %s is QNN %s, newer than the QNN %s ExecuTorch %s was built against; "
            "this combination is untested. If QNN calls fail, use a QNN %s.x SDK or unset "
            "QNN_SDK_ROOT for the project's x86 dev SDK",
            sdk.root,
            sdk.qnn_version,
            built,
            EXECUTORCH_VERSION,
            built,
        )
    elif version < EXECUTORCH_QNN_VERSION:
        log.warning(
            "the QNN SDK at %s is QNN %s, older than the QNN %s ExecuTorch %s was built against; "
            "it may lack APIs ExecuTorch calls. Use a QNN %s.x SDK if QNN calls fail",
            sdk.root,
            sdk.qnn_version,
            built,
            EXECUTORCH_VERSION,
            built,
        )

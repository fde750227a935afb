"""Which QNN versions an SDK's libraries report, asked in a child interpreter, and its cache."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from qnn_common.errors import BackendNotAvailableError
from qnn_common.qnn_sdk.layout import HTP_LIB, SYSTEM_LIB, dev_sdk_cache_dir
from qnn_common.store.atomic import atomic_write_text

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 120.0

# Runs in a child interpreter: loading QNN into this process before torch breaks torch later
# (`libc++abi: Pure virtual function called!`). Layout of QnnInterface_t (QnnInterface.h), checked
# against QNN 2.51: uint32 backendId @0, const char* providerName @8, Qnn_ApiVersion_t @16 (core
# major/minor/patch, backend major/minor/patch: six uint32), function table @40, whose entry 4 is
# backendGetBuildId(const char** id) -> Qnn_ErrorHandle_t (uint64, 0 = success), and entry 40
# deviceCreate. Which library each of those two lives in (dladdr) tells a bridged SDK: a bridge
# replaces deviceCreate only.
_PROBE_SCRIPT = r"""
import ctypes, json, sys
MARK = "QNN_SDK_PROBE "
def out(data):
    sys.stdout.write("\n" + MARK + json.dumps(data) + "\n")
    sys.stdout.flush()
htp_path, system_path = sys.argv[1], sys.argv[2]
try:
    htp = ctypes.CDLL(htp_path)
except OSError as err:
    out({"error": "cannot load %s: %s" % (htp_path, err)}); sys.exit(0)
try:
    system = ctypes.CDLL(system_path)
except OSError as err:
    out({"error": "cannot load %s: %s" % (system_path, err)}); sys.exit(0)
if not hasattr(system, "QnnSystemInterface_getProviders"):
    out({"error": "%s has no QnnSystemInterface_getProviders" % system_path}); sys.exit(0)
if not hasattr(htp, "QnnInterface_getProviders"):
    out({"error": "%s has no QnnInterface_getProviders" % htp_path}); sys.exit(0)
class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
try:
    dladdr = ctypes.CDLL(None).dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
except AttributeError:
    dladdr = None
def owner(address):
    info = DlInfo()
    if dladdr is None or not address or not dladdr(address, ctypes.byref(info)) or not info.fname:
        return ""
    return info.fname.decode("utf-8", "replace")
get_providers = htp.QnnInterface_getProviders
get_providers.restype = ctypes.c_int
get_providers.argtypes = [
    ctypes.POINTER(ctypes.POINTER(ctypes.c_void_p)), ctypes.POINTER(ctypes.c_uint32)]
providers = ctypes.POINTER(ctypes.c_void_p)()
count = ctypes.c_uint32(0)
status = get_providers(ctypes.byref(providers), ctypes.byref(count))
if status != 0 or count.value == 0 or not providers:
    out({"error": "QnnInterface_getProviders returned status %d with %d providers"
         % (status, count.value)}); sys.exit(0)
entries = []
for i in range(count.value):
    iface = providers[i]
    if not iface:
        continue
    api = list((ctypes.c_uint32 * 6).from_address(iface + 16))
    name = ctypes.c_char_p.from_address(iface + 8).value
    build_id, build_id_error = "", None
    table = iface + 40
    fn_ptr = ctypes.c_void_p.from_address(table + 4 * ctypes.sizeof(ctypes.c_void_p)).value
    device_create = ctypes.c_void_p.from_address(table + 40 * ctypes.sizeof(ctypes.c_void_p)).value
    if fn_ptr:
        get_build_id = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.POINTER(ctypes.c_char_p))(fn_ptr)
        text = ctypes.c_char_p()
        build_id_error = int(get_build_id(ctypes.byref(text)))
        if build_id_error == 0 and text.value:
            build_id = text.value.decode("utf-8", "replace")
    entries.append({
        "backend_id": ctypes.c_uint32.from_address(iface).value,
        "provider": name.decode("utf-8", "replace") if name else "",
        "core_api": api[:3], "backend_api": api[3:],
        "build_id": build_id, "build_id_error": build_id_error,
        "build_id_owner": owner(fn_ptr), "device_create_owner": owner(device_create),
    })
out({"providers": entries})
"""
_PROBE_MARK = "QNN_SDK_PROBE "
_PROBE_FORMAT = 1  # part of the probe cache key: a new field invalidates cached probes
_QNN_BACKEND_ID_HTP = 6


def probe_libraries(lib_dir: Path) -> dict[str, Any]:
    """Load the SDK's HTP and System libraries in a child interpreter; their version record."""
    htp, system = lib_dir / HTP_LIB, lib_dir / SYSTEM_LIB
    # -I -S: the child needs only ctypes and json; keep PYTHONPATH and site hooks out of it.
    cmd = [sys.executable, "-I", "-S", "-c", _PROBE_SCRIPT, str(htp), str(system)]
    start = time.monotonic()
    try:
        result = subprocess.run(
            cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BackendNotAvailableError(
            f"cannot probe the QNN libraries in {lib_dir}: {err}"
        ) from err
    log.debug("probed %s in %.2f s", lib_dir, time.monotonic() - start)
    payload: dict[str, Any] | None = None
    for line in result.stdout.splitlines():
        if line.startswith(_PROBE_MARK):
            payload = json.loads(line[len(_PROBE_MARK) :])
    if result.returncode != 0 or payload is None:
        raise BackendNotAvailableError(
            f"loading the QNN libraries in {lib_dir} in a child process failed (exit "
            f"{result.returncode}): {result.stderr.strip()[-2000:] or 'no output'}. The SDK is "
            "broken or not an x86_64 Linux SDK: reinstall it, or unset QNN_SDK_ROOT to use the "
            "project's x86 dev SDK"
        )
    if "error" in payload:
        raise BackendNotAvailableError(
            f"{lib_dir} is not a usable QNN SDK: {payload['error']}. Point QNN_SDK_ROOT at a "
            "Qualcomm SDK with x86_64 libraries, or unset it to use the project's x86 dev SDK"
        )
    providers: list[dict[str, Any]] = payload["providers"]
    chosen = next(
        (p for p in providers if p["backend_id"] == _QNN_BACKEND_ID_HTP), providers[0]
    )
    return chosen


def probe_libraries_cached(lib_dir: Path) -> dict[str, Any]:
    """`probe_libraries` for an external SDK, cached by the HTP library's path, mtime and size."""
    htp = (lib_dir / HTP_LIB).resolve()
    stat = htp.stat()
    ident = f"{_PROBE_FORMAT}\0{htp}\0{stat.st_mtime_ns}\0{stat.st_size}"
    digest = hashlib.sha256(ident.encode()).hexdigest()[:24]
    try:
        cache_file: Path | None = dev_sdk_cache_dir() / "probes" / f"{digest}.json"
    except BackendNotAvailableError:
        cache_file = None
    if cache_file is not None:
        try:
            cached = json.loads(cache_file.read_text())
            if isinstance(cached, dict) and cached.get("ident") == ident:
                probe: dict[str, Any] = cached["probe"]
                return probe
        except (OSError, ValueError, KeyError):
            pass
    probe = probe_libraries(lib_dir)
    if cache_file is not None:
        try:
            atomic_write_text(cache_file, json.dumps({"ident": ident, "probe": probe}) + "\n")
        except OSError as err:
            log.debug("not caching the QNN version probe in %s: %s", cache_file, err)
    return probe


def is_bridged(probe: dict[str, Any]) -> bool:
    """True if deviceCreate lives in another library than the backend (a bridge in front)."""
    device_create = probe.get("device_create_owner") or ""
    backend = probe.get("build_id_owner") or ""
    if not device_create or not backend:
        return False
    return os.path.realpath(device_create) != os.path.realpath(backend)


def qnn_version(probe: dict[str, Any]) -> str:
    """The SDK's QNN version: from the backend build id, else "2.<backend API minor>"."""
    match = re.search(r"v(\d+)\.(\d+)\.(\d+)", probe.get("build_id") or "")
    if match:
        return ".".join(match.groups())
    # The HTP backend API minor tracks the SDK minor (5.51 in QNN 2.51); the patch is unknown.
    return f"2.{probe['backend_api'][1]}"

"""The installed onnxruntime-qnn wheel the dev SDK is made from: where it is, which files it has.

The package is located with find_spec and never imported (importing it imports onnxruntime).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from qnn_common.errors import BackendNotAvailableError
from qnn_common.qnn_sdk.layout import HTP_LIB, dev_sdk_cache_dir
from qnn_common.store.atomic import atomic_write_text

log = logging.getLogger(__name__)

DEV_PACKAGE = "onnxruntime_qnn"
DEV_DISTRIBUTION = "onnxruntime-qnn"
DEV_DISTRIBUTION_VERSION = "2.7.0"  # what the bridge was verified against (QNN 2.51)
# The wheels' extra that installs it (qnn-common[qnn-dev-sdk], forwarded by the stages that use it).
DEV_SDK_EXTRA = "qnn-dev-sdk"
# The wheel's libraries carry RPATH $ORIGIN:$ORIGIN/../onnxruntime_qnn.libs, so the SDK keeps
# this directory name beside lib/x86_64-linux-clang/.
DEV_RUNTIME_LIBS = "onnxruntime_qnn.libs"

Row = tuple[str, str, str]


@dataclass(frozen=True)
class DevPackage:
    """The installed onnxruntime-qnn: where its libraries are and what identifies them."""

    package_dir: Path  # .../onnxruntime_qnn
    runtime_libs_dir: Path  # .../onnxruntime_qnn.libs (libc++, libc++abi, libunwind)
    version: str
    record_rows: tuple[Row, ...]  # RECORD rows of the files the SDK holds

    @property
    def source(self) -> str:
        return f"{DEV_DISTRIBUTION}=={self.version} (x86 dev SDK, bridged)"


def find_dev_package() -> DevPackage | None:
    """The onnxruntime-qnn installed where Python imports from, None if there is none."""
    # find_spec, not import: importing onnxruntime_qnn imports onnxruntime, which we never need.
    spec = importlib.util.find_spec(DEV_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    site_dir = package_dir.parent
    # The distribution installed beside the package we found, not any other one on sys.path.
    dists = list(importlib.metadata.distributions(name=DEV_DISTRIBUTION, path=[str(site_dir)]))
    if not dists:
        raise BackendNotAvailableError(
            f"found the package {package_dir} but no {DEV_DISTRIBUTION} metadata beside it in "
            f"{site_dir}: reinstall it (`pip install --no-deps "
            f"{DEV_DISTRIBUTION}=={DEV_DISTRIBUTION_VERSION}`)"
        )
    dist = dists[0]
    runtime_libs_dir = site_dir / DEV_RUNTIME_LIBS
    rows = record_rows(dist.read_text("RECORD"))
    if not rows:
        # pex's wheel cache (what a zipapp PEX runs from) keeps no RECORD: hash the files the
        # same way, so the key and the cache dir are the same as with a pip install.
        rows = hashed_rows(package_dir, runtime_libs_dir)
    if not any(rel == f"{DEV_PACKAGE}/{HTP_LIB}" for rel, _, _ in rows):
        raise BackendNotAvailableError(
            f"{DEV_DISTRIBUTION} {dist.version} in {site_dir} has no {HTP_LIB}: install "
            f"{DEV_DISTRIBUTION}=={DEV_DISTRIBUTION_VERSION} (the Linux x86_64 wheel)"
        )
    return DevPackage(
        package_dir=package_dir,
        runtime_libs_dir=runtime_libs_dir,
        version=dist.version,
        record_rows=rows,
    )


def record_rows(record: str | None) -> tuple[Row, ...]:
    """(path, "sha256=<urlsafe b64>", size) of the SDK's files, as the wheel's RECORD lists them."""
    if not record:
        return ()
    rows = [
        (row[0], row[1], row[2])
        for row in csv.reader(io.StringIO(record))
        if len(row) >= 3 and row[1] and _is_sdk_file(row[0])
    ]
    return tuple(sorted(rows))


def hashed_rows(package_dir: Path, runtime_libs_dir: Path) -> tuple[Row, ...]:
    """The rows RECORD would hold, computed; digests are remembered by path, size and mtime."""
    files = [(f"{DEV_PACKAGE}/{p.name}", p) for p in package_dir.glob("lib*.so")]
    if runtime_libs_dir.is_dir():
        files += [(f"{DEV_RUNTIME_LIBS}/{p.name}", p) for p in runtime_libs_dir.iterdir()]
    memo_file = dev_sdk_cache_dir() / "file-digests.json"
    try:
        memo = json.loads(memo_file.read_text())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    fresh: dict[str, str] = {}
    rows = []
    for rel, path in files:
        if not _is_sdk_file(rel) or not path.is_file():
            continue
        stat = path.stat()
        ident = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}"
        digest = memo.get(ident)
        if not isinstance(digest, str):
            with open(path, "rb") as fh:
                raw = hashlib.file_digest(fh, "sha256").digest()
            digest = "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        fresh[ident] = digest
        rows.append((rel, digest, str(stat.st_size)))
    if any(memo.get(ident) != digest for ident, digest in fresh.items()):
        # Keep other installs' entries while their files exist; drop the rest.
        merged = {
            ident: digest
            for ident, digest in {**memo, **fresh}.items()
            if os.path.exists(ident.split("|", 1)[0])
        }
        try:
            atomic_write_text(memo_file, json.dumps(merged, indent=1, sort_keys=True) + "\n")
        except OSError as err:
            log.debug("not remembering file digests in %s: %s", memo_file, err)
    return tuple(sorted(rows))


def _is_sdk_file(record_path: str) -> bool:
    parts = record_path.split("/")
    if len(parts) != 2:
        return False
    if parts[0] == DEV_PACKAGE:
        return parts[1].startswith("lib") and parts[1].endswith(".so")
    return parts[0] == DEV_RUNTIME_LIBS

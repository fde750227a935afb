"""The built wheels declare what a library should: ranges, not this repo's pins.

Reads the METADATA of every wheel `./pants package` builds (runtime_package_dependencies put them
in the sandbox) and fails on a third-party `==` or `+local` pin, on a third-party range that is
not requirements.txt's, on a first-party requirement without a `~=` range on the version built
beside it, on the dev QNN SDK outside its extra, and on a Requires-Python other than the
interpreters the tests run on (pants.toml). The checker itself is tested on crafted metadata, so
a passing run means the wheels are right, not that the check looks at nothing.
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = {
    "qnn-common", "qnn-prepare", "qnn-quant", "qnn-compile", "qnn-infer", "qnn-pipeline",
}
# Heavy or platform-bound requirements that must reach a user only through an extra.
EXTRA_ONLY = {"onnxruntime-qnn": "qnn-dev-sdk", "gguf": "smollm2", "accelerate": "smollm2"}


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    requires_python: str
    requires: tuple[Requirement, ...]


def read_wheel(path: Path) -> Wheel:
    with zipfile.ZipFile(path) as zf:
        (meta,) = (n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return parse_metadata(zf.read(meta).decode())


def parse_metadata(text: str) -> Wheel:
    msg = Parser().parsestr(text)
    return Wheel(
        name=canonicalize_name(msg["Name"]),
        version=msg["Version"],
        requires_python=msg.get("Requires-Python", ""),
        requires=tuple(Requirement(r) for r in msg.get_all("Requires-Dist") or []),
    )


def extra_of(req: Requirement) -> str | None:
    """The extra a requirement belongs to, None for an unconditional one."""
    found = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", str(req.marker or ""))
    return found.group(1) if found else None


def declared_ranges(requirements_txt: str) -> dict[str, SpecifierSet]:
    ranges: dict[str, SpecifierSet] = {}
    for line in requirements_txt.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            ranges[canonicalize_name(req.name)] = req.specifier
    return ranges


def locked_pins(lock_text: str) -> dict[str, str]:
    lines = lock_text.splitlines(keepends=True)
    body = "".join(line for line in lines if not line.startswith("//"))
    (resolve,) = json.loads(body)["locked_resolves"]
    return {r["project_name"]: r["version"] for r in resolve["locked_requirements"]}


def problems(
    wheel: Wheel,
    *,
    versions: dict[str, str],
    ranges: dict[str, SpecifierSet],
    pins: dict[str, str],
    requires_python: str,
) -> list[str]:
    """Everything wrong with one wheel's requirements, each saying what to change."""
    out: list[str] = []
    where = f"{wheel.name} {wheel.version}"
    if wheel.requires_python != requires_python:
        out.append(
            f"{where}: Requires-Python {wheel.requires_python!r}, but the tests run on "
            f"{requires_python!r} (pants.toml [python] interpreter_constraints): set "
            "python_requires in its BUILD to that"
        )
    unconditional = {canonicalize_name(r.name): r for r in wheel.requires if extra_of(r) is None}
    for req in wheel.requires:
        name = canonicalize_name(req.name)
        extra = extra_of(req)
        if name in FIRST_PARTY:
            if extra is not None and not req.specifier and name in unconditional:
                continue  # an extra forwarded (qnn-common[qnn-dev-sdk]); the range is on the base
            want = f"~={versions[name]}"
            if str(req.specifier) != want:
                out.append(
                    f"{where}: first-party {req} must be `{name}{want}` (the version built "
                    "beside it, compatible release): keep [setup-py-generation] "
                    'first_party_dependency_version_scheme = "compatible"'
                )
            continue
        for spec in req.specifier:
            if spec.operator in ("==", "===") or "+" in spec.version:
                out.append(
                    f"{where}: third-party {req} is a pin ({spec}); exact versions belong in "
                    "the lockfile: declare a range in 3rdparty/python/requirements.txt"
                )
        if name not in ranges:
            out.append(f"{where}: {name} is not in 3rdparty/python/requirements.txt")
        elif req.specifier != ranges[name]:
            out.append(
                f"{where}: {req} declares {req.specifier or 'no range'}, requirements.txt "
                f"{ranges[name]}: make the BUILD's extras_require line the same"
            )
        if name in pins and not req.specifier.contains(pins[name], prereleases=True):
            out.append(f"{where}: {req} excludes the locked {name}=={pins[name]}")
        if name in EXTRA_ONLY and extra != EXTRA_ONLY[name]:
            out.append(
                f"{where}: {name} must come only with the extra [{EXTRA_ONLY[name]}], "
                f"not {'unconditionally' if extra is None else f'[{extra}]'}"
            )
    return out


def python_the_tests_run_on() -> str:
    """pants.toml's `CPython==3.11.*` as the Requires-Python it means: `>=3.11,<3.12`."""
    text = (ROOT / "pants.toml").read_text()
    pattern = r'interpreter_constraints = \["CPython==(\d+)\.(\d+)\.\*"\]'
    (major, minor) = re.findall(pattern, text)[0]
    return f">={major}.{minor},<{major}.{int(minor) + 1}"


@pytest.fixture(scope="module")
def wheels() -> list[Wheel]:
    # pytest.pex/ in the sandbox holds wheels too: only those built by ./pants package.
    paths = sorted(p for p in Path.cwd().rglob("qnn_*.whl") if "pytest.pex" not in p.parts)
    assert paths, "no wheel in the sandbox: runtime_package_dependencies in tests/wheels/BUILD"
    return [read_wheel(p) for p in paths]


@dataclass(frozen=True)
class Declared:
    """What the repository declares: requirements.txt's ranges and the lock's pins."""

    ranges: dict[str, SpecifierSet]
    pins: dict[str, str]


@pytest.fixture(scope="module")
def context() -> Declared:
    reqs = (ROOT / "3rdparty/python/requirements.txt").read_text()
    lock = (ROOT / "3rdparty/python/python-default.lock").read_text()
    return Declared(declared_ranges(reqs), locked_pins(lock))


def test_one_wheel_per_package(wheels: list[Wheel]) -> None:
    assert sorted(w.name for w in wheels) == sorted(FIRST_PARTY)


def test_wheels_declare_ranges_not_pins(wheels: list[Wheel], context: Declared) -> None:
    versions = {w.name: w.version for w in wheels}
    found = [
        p
        for w in wheels
        for p in problems(
            w,
            versions=versions,
            ranges=context.ranges,
            pins=context.pins,
            requires_python=python_the_tests_run_on(),
        )
    ]
    assert not found, "\n".join(found)


def test_xnnpack_user_gets_no_qnn_sdk(wheels: list[Wheel]) -> None:
    """`pip install qnn-pipeline` (no extra) reaches onnxruntime-qnn through no wheel."""
    by_name = {w.name: w for w in wheels}
    seen: set[str] = set()
    todo = ["qnn-pipeline"]
    third_party: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for req in by_name[name].requires:
            if extra_of(req) is not None:
                continue
            dep = canonicalize_name(req.name)
            if dep in FIRST_PARTY:
                todo.append(dep)
            else:
                third_party.add(dep)
    assert seen == FIRST_PARTY
    assert not third_party & set(EXTRA_ONLY), third_party & set(EXTRA_ONLY)
    assert "torch" in third_party


def test_constraints_hold_the_lock_pins(context: Declared) -> None:
    pins = context.pins
    text = (ROOT / "3rdparty/python/constraints.txt").read_text()
    constrained = dict(
        line.split("==", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert constrained == pins, (
        "3rdparty/python/constraints.txt is not the lock's pins: run "
        "`python3 build-support/lock_constraints.py`"
    )
    assert pins["torch"].endswith("+cpu"), "torch must stay the CPU wheel from /opt/wheels"


BAD = """\
Metadata-Version: 2.1
Name: qnn-quant
Version: 0.2.0
Requires-Python: >=3.9
Requires-Dist: torch (==2.13.0+cpu)
Requires-Dist: executorch (<1.6,>=1.5.1)
Requires-Dist: qnn-common
Requires-Dist: onnxruntime-qnn (~=2.7.0)
Requires-Dist: tqdm (>=4)
"""


def test_the_check_catches_pins_and_missing_ranges() -> None:
    found = problems(
        parse_metadata(BAD),
        versions={"qnn-common": "0.1.0"},
        ranges={
            "torch": SpecifierSet(">=2.13,<2.14"),
            "executorch": SpecifierSet(">=1.5.1,<1.6"),
            "onnxruntime-qnn": SpecifierSet("~=2.7.0"),
            "tqdm": SpecifierSet(">=4.66,<5"),
        },
        pins={"torch": "2.13.0+cpu", "executorch": "1.5.1", "tqdm": "4.70.1"},
        requires_python=">=3.11,<3.12",
    )
    text = "\n".join(found)
    assert "Requires-Python '>=3.9'" in text
    assert "third-party torch==2.13.0+cpu is a pin" in text
    assert "first-party qnn-common must be `qnn-common~=0.1.0`" in text
    assert "onnxruntime-qnn must come only with the extra [qnn-dev-sdk]" in text
    assert "tqdm>=4 declares >=4, requirements.txt <5,>=4.66" in text
    assert not any("executorch" in p for p in found)
    assert Version("2.13.0+cpu") in SpecifierSet(">=2.13,<2.14")

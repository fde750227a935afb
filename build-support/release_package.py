"""Release packages to a package index: `./pants package` their wheels and sdists, then twine.

    python3 build-support/release_package.py qnn-quant-v0.2.0 [more tags] \
        --repository-url https://upload.pypi.org/legacy/

Each tag names a package and its version (`<dist>-v<X.Y.Z>`, as the version policy reads them).
Before anything is uploaded it checks, for every tag: the tag exists and is HEAD (what is built
is what was tagged); the package's BUILD version is the tag's; the version policy passes for it
(CHANGELOG.md section, __version__); each first-party requirement of the built wheel
(`qnn-common~=0.1.0`) names a version released with a tag, or one released in the same run.
Credentials come from twine's environment (TWINE_USERNAME / TWINE_PASSWORD, or a token), never
from the command line. twine runs as `<this python> -m twine`: install it beside the script
(`pip install -r build-support/release-requirements.txt`).
"""

from __future__ import annotations

import argparse
import email.parser
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import version_policy

TAG = re.compile(r"^(qnn-[a-z-]+)-v(\d+\.\d+\.\d+)$")
FIRST_PARTY_REQ = re.compile(r"^(qnn-[a-z-]+) \(~=(\d+\.\d+\.\d+)\)")


class ReleaseError(Exception):
    """A release refused before upload; the message says what to do."""


@dataclass(frozen=True)
class Planned:
    tag: str
    package: version_policy.Package


def plan(repo: Path, tags: list[str]) -> list[Planned]:
    current = {p.dist: p for p in version_policy.packages(repo).values()}
    head = version_policy.git(repo, "rev-parse", "HEAD").strip()
    errors, _ = version_policy.check(repo)
    planned: list[Planned] = []
    for tag in tags:
        match = TAG.match(tag)
        if not match:
            raise ReleaseError(f"{tag}: not a release tag; expected <package>-v<X.Y.Z>, "
                               "e.g. qnn-quant-v0.2.0")
        dist, version = match[1], match[2]
        if dist not in current:
            raise ReleaseError(f"{tag}: no package {dist} under src/python "
                               f"(known: {', '.join(sorted(current))})")
        package = current[dist]
        if package.version != version:
            raise ReleaseError(f"{tag}: src/python/{package.directory}/BUILD says version "
                               f"{package.version}; bump it to {version} (with __version__ and "
                               "CHANGELOG.md), commit, and move the tag onto that commit")
        tagged = version_policy.git(repo, "rev-list", "-n", "1", tag, check=False).strip()
        if not tagged:
            raise ReleaseError(f"{tag}: no such tag: `git tag {tag}` on the commit to release")
        if tagged != head:
            raise ReleaseError(f"{tag} is {tagged[:12]}, HEAD is {head[:12]}: check out the tag "
                               "(what is built must be what was tagged)")
        mine = [e for e in errors if e.startswith(f"{dist}:")]
        if mine:
            raise ReleaseError(f"{tag}: the version policy fails: " + "; ".join(mine))
        planned.append(Planned(tag, package))
    return planned


def build(repo: Path, planned: list[Planned]) -> dict[str, list[Path]]:
    """`./pants package` the distributions; tag -> [wheel, sdist] under dist/."""
    targets = [f"src/python/{p.package.directory}:dist" for p in planned]
    proc = subprocess.run(["./pants", "package", *targets], cwd=repo, check=False)
    if proc.returncode != 0:
        raise ReleaseError(f"./pants package {' '.join(targets)} failed (exit {proc.returncode})")
    out: dict[str, list[Path]] = {}
    for p in planned:
        stem = f"{p.package.dist.replace('-', '_')}-{p.package.version}"
        files = [repo / "dist" / f"{stem}-py3-none-any.whl",
                 repo / "dist" / f"{p.package.dist}-{p.package.version}.tar.gz"]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ReleaseError(f"{p.tag}: ./pants package wrote no {', '.join(missing)}")
        out[p.tag] = files
    return out


def first_party_requirements(wheel: Path) -> list[tuple[str, str]]:
    """(dist, base version) of each `qnn-*~=X.Y.Z` Requires-Dist of a wheel."""
    with zipfile.ZipFile(wheel) as zf:
        (name,) = (n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(name).decode())
    found = []
    for req in meta.get_all("Requires-Dist") or []:
        match = FIRST_PARTY_REQ.match(req)
        if match and "extra ==" not in req:
            found.append((match[1], match[2]))
    return found


def check_dependencies_released(repo: Path, planned: list[Planned],
                                built: dict[str, list[Path]]) -> None:
    in_this_run = {p.package.dist: p.package.version for p in planned}
    for p in planned:
        for dist, base in first_party_requirements(built[p.tag][0]):
            tags = version_policy.git(repo, "tag", "--list", f"{dist}-v*").split()
            released = [t.removeprefix(f"{dist}-v") for t in tags]
            if dist in in_this_run:
                released.append(in_this_run[dist])
            valid = [v for v in released if version_policy.VERSION.match(v)]
            if not any(version_policy.compatible(v, base) for v in valid):
                raise ReleaseError(
                    f"{p.tag}: its wheel requires {dist}~={base}, and no {dist} release "
                    f"satisfies it (tags: {', '.join(tags) or 'none'}): release {dist} "
                    f"{base} first (tag {dist}-v{base}), or in the same run"
                )


def upload(files: list[Path], repository_url: str) -> None:
    cmd = [sys.executable, "-m", "twine", "upload", "--non-interactive",
           "--repository-url", repository_url, *map(str, files)]
    proc = subprocess.run(cmd, check=False, env=os.environ.copy())
    if proc.returncode != 0:
        raise ReleaseError(f"twine upload to {repository_url} failed (exit {proc.returncode}); "
                           "is twine installed (build-support/release-requirements.txt) and are "
                           "TWINE_USERNAME / TWINE_PASSWORD set?")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tags", nargs="+", help="release tags, e.g. qnn-quant-v0.2.0")
    parser.add_argument("--repository-url", required=True,
                        help="the index's upload URL, e.g. https://upload.pypi.org/legacy/")
    parser.add_argument("--repo", type=Path, default=Path.cwd())
    parser.add_argument("--dry-run", action="store_true", help="check and build, upload nothing")
    args = parser.parse_args(argv)
    repo = Path(version_policy.git(args.repo, "rev-parse", "--show-toplevel").strip())
    try:
        planned = plan(repo, args.tags)
        built = build(repo, planned)
        check_dependencies_released(repo, planned, built)
        # Dependencies first, so an index never holds a stage whose qnn-common is not there yet.
        order = sorted(planned, key=lambda p: p.package.dist != "qnn-common")
        for p in order:
            if args.dry_run:
                print(f"release: {p.tag}: built {', '.join(f.name for f in built[p.tag])}")
                continue
            upload(built[p.tag], args.repository_url)
            print(f"release: {p.tag}: uploaded {', '.join(f.name for f in built[p.tag])}")
    except ReleaseError as e:
        print(f"release: refused: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

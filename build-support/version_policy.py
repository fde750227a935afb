"""The version policy: a package whose wheel would change since its last release has a new version.

For every python_distribution under src/python/ (name and version from its BUILD), against its
last release tag `<dist>-v<version>` (e.g. `qnn-quant-v0.1.0`) reachable from HEAD:

- a changed file that ships in the wheel (the package directory minus tests, conftest and the
  changelog; the BUILD counts, it makes the metadata) requires a version above the tagged one;
- the bump must match the change: the `~=X.Y.Z` ranges Pants writes between our packages
  ([setup-py-generation] "compatible") admit X.Y.*, so Y is the compatibility boundary; a public
  name removed or a public signature changed requires Y + 1, anything else Z + 1 at least;
- the version in the BUILD must equal `__version__`, and CHANGELOG.md must have a `## <version>`
  section with an entry;
- a first-party dependency (qnn_common) whose version left the `~=` range a released package was
  built with (read at that package's tag) requires that package to be bumped too: its released
  wheel cannot be installed with the new qnn-common;
- a third-party range changed in 3rdparty/python/requirements.txt changes the Requires-Dist of
  the packages whose shipped modules depend on it: those need a bump too. Which packages, only
  Pants' graph knows (`./pants dependents`), so Pants runs only when a range did change.

Changes come from git (`git diff <tag>` on the package directory, plus untracked files), not from
Pants' changed set: a release is the package directory's files, while Pants' `--changed-since`
with dependents would also flag every stage when qnn_common changes, which the range rule above
handles exactly. Stdlib only, and Pants only for a changed range: CI runs it in seconds.

Usage: python3 build-support/version_policy.py [--repo DIR]; exit 1 on a violation.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SRC = "src/python"
ARTIFACT = re.compile(r'python_artifact\([^)]*?name="([^"]+)"[^)]*?version="([^"]+)"', re.S)
DUNDER_VERSION = re.compile(r'^__version__\s*=\s*"([^"]+)"', re.M)
IMPORT = re.compile(r"^\s*(?:from|import)\s+(qnn_\w+)", re.M)
VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
REQUIREMENTS = "3rdparty/python/requirements.txt"
REQUIREMENT_TARGET = "3rdparty/python:reqs#{}"


@dataclass(frozen=True)
class Package:
    directory: str  # qnn_quant
    dist: str  # qnn-quant
    version: str


@dataclass(frozen=True)
class Release:
    tag: str
    version: str


def git(repo: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
    )
    if check and proc.returncode != 0:
        raise SystemExit(f"version-policy: git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def read(repo: Path, path: str, rev: str | None) -> str | None:
    """A file at a revision (None: the working tree); None if it does not exist there."""
    if rev is None:
        file = repo / path
        return file.read_text() if file.is_file() else None
    proc = subprocess.run(
        ["git", "-C", str(repo), "show", f"{rev}:{path}"], capture_output=True, text=True
    )
    return proc.stdout if proc.returncode == 0 else None


def parse_version(text: str) -> tuple[int, int, int]:
    match = VERSION.match(text)
    if not match:
        raise SystemExit(f"version-policy: {text!r} is not a release version X.Y.Z")
    return int(match[1]), int(match[2]), int(match[3])


def packages(repo: Path, rev: str | None = None) -> dict[str, Package]:
    """directory -> Package, for every src/python/<dir>/BUILD with a python_artifact."""
    if rev is None:
        dirs = sorted(p.parent.name for p in (repo / SRC).glob("*/BUILD"))
    else:
        listing = git(repo, "ls-tree", "--name-only", f"{rev}:{SRC}", check=False)
        dirs = sorted(listing.split())
    found: dict[str, Package] = {}
    for directory in dirs:
        build = read(repo, f"{SRC}/{directory}/BUILD", rev)
        match = ARTIFACT.search(build or "")
        if match:
            found[directory] = Package(directory, match[1], match[2])
    return found


def last_release(repo: Path, dist: str) -> Release | None:
    """The highest `<dist>-v<X.Y.Z>` tag reachable from HEAD."""
    tags = git(repo, "tag", "--merged", "HEAD", "--list", f"{dist}-v*").split()
    releases = [
        Release(tag, tag.removeprefix(f"{dist}-v"))
        for tag in tags
        if VERSION.match(tag.removeprefix(f"{dist}-v"))
    ]
    return max(releases, key=lambda r: parse_version(r.version), default=None)


def ships(path: str) -> bool:
    """Whether a file under a package directory is part of its wheel (or makes its metadata)."""
    name = path.rsplit("/", 1)[-1]
    if name.endswith("_test.py") or name.startswith("test_") or name == "conftest.py":
        return False
    return name not in ("CHANGELOG.md", "README.md")


def changed_files(repo: Path, tag: str, directory: str) -> list[str]:
    """Shipped files that differ between the tag and the working tree (untracked ones too)."""
    where = f"{SRC}/{directory}"
    diffed = git(repo, "diff", "--name-only", tag, "--", where).split()
    untracked = git(repo, "ls-files", "--others", "--exclude-standard", "--", where).split()
    return sorted(p for p in {*diffed, *untracked} if ships(p))


def public_api(source: str | None) -> dict[str, str]:
    """Public top-level names (and public methods of public classes) -> their signature."""
    if source is None:
        return {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}

    def signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
        return ast.unparse(node.args)

    api: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if not node.name.startswith("_"):
                api[node.name] = f"def ({signature(node)})"
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            api[node.name] = "class"
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    not item.name.startswith("_") or item.name == "__init__"
                ):
                    api[f"{node.name}.{item.name}"] = f"def ({signature(item)})"
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and not target.id.startswith("_"):
                    api[target.id] = "name"
    return api


def module_name(path: str) -> str:
    return path.removeprefix(f"{SRC}/").removesuffix(".py").replace("/", ".")


def breaking_changes(repo: Path, tag: str, files: list[str]) -> list[str]:
    """Public names removed or whose signature changed, in the changed modules."""
    out: list[str] = []
    for path in files:
        if not path.endswith(".py") or any(p.startswith("_") for p in path.split("/")[3:-1]):
            continue
        if path.rsplit("/", 1)[-1].startswith("_") and not path.endswith("__init__.py"):
            continue
        old, new = public_api(read(repo, path, tag)), public_api(read(repo, path, None))
        for name, sig in sorted(old.items()):
            if name not in new:
                out.append(f"{module_name(path)}.{name} removed")
            elif new[name] != sig:
                out.append(f"{module_name(path)}.{name} changed {sig} -> {new[name]}")
    return out


def first_party_imports(repo: Path, directory: str, rev: str | None, dirs: set[str]) -> set[str]:
    """The other packages a package's shipped modules import (as Pants would infer)."""
    if rev is None:
        paths = [str(p.relative_to(repo)) for p in (repo / SRC / directory).rglob("*.py")]
    else:
        paths = git(repo, "ls-tree", "-r", "--name-only", rev, "--", f"{SRC}/{directory}").split()
    found: set[str] = set()
    for path in paths:
        if path.endswith(".py") and ships(path):
            found.update(IMPORT.findall(read(repo, path, rev) or ""))
    return (found & dirs) - {directory}


def changelog_problem(repo: Path, package: Package) -> str | None:
    path = f"{SRC}/{package.directory}/CHANGELOG.md"
    text = read(repo, path, None)
    if text is None:
        return f"{path} is missing: add it with a `## {package.version}` section"
    section = re.search(
        rf"^##\s+\[?{re.escape(package.version)}\]?\b.*?$(.*?)(?=^##\s|\Z)", text, re.M | re.S
    )
    if section is None:
        return f"{path} has no `## {package.version}` section: add one saying what changed"
    if not section[1].strip():
        return f"{path}: the `## {package.version}` section is empty: say what changed"
    return None


def requirement_lines(text: str | None) -> dict[str, str]:
    """requirements.txt as normalized project name -> its line (spec and marker)."""
    out: dict[str, str] = {}
    for raw in (text or "").splitlines():
        line = raw.split("#", 1)[0].strip()
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        if match:
            out[re.sub(r"[-_.]+", "-", match[1]).lower()] = re.sub(r"\s+", "", line)
    return out


def changed_ranges(repo: Path, tag: str) -> list[str]:
    """Projects whose requirements.txt line differs between the tag and the working tree."""
    old = requirement_lines(read(repo, REQUIREMENTS, tag))
    new = requirement_lines(read(repo, REQUIREMENTS, None))
    return sorted(name for name in new.keys() | old.keys() if old.get(name) != new.get(name))


class Dependents:
    """Which packages' shipped modules depend on a requirement: `./pants dependents`, memoized."""

    def __init__(self, repo: Path, pants: str) -> None:
        self.repo, self.pants = repo, pants
        self.memo: dict[str, set[str]] = {}

    def packages(self, projects: list[str]) -> dict[str, set[str]]:
        """project -> package directories whose shipped sources depend on it directly."""
        todo = [p for p in projects if p not in self.memo]
        for project in todo:
            proc = subprocess.run(
                [self.pants, "dependents", REQUIREMENT_TARGET.format(project)],
                cwd=self.repo, capture_output=True, text=True, check=False,
            )
            if proc.returncode != 0:
                raise SystemExit(
                    f"version-policy: `{self.pants} dependents "
                    f"{REQUIREMENT_TARGET.format(project)}` failed (exit {proc.returncode}); "
                    f"{REQUIREMENTS} changed, and only Pants knows which packages use it:\n"
                    f"{proc.stderr[-2000:]}"
                )
            found: set[str] = set()
            for address in proc.stdout.split():
                path = address.split(":", 1)[0]
                parts = path.split("/")
                if path.startswith(f"{SRC}/") and len(parts) > 3 and ships(path):
                    found.add(parts[2])
            self.memo[project] = found
        return {p: self.memo[p] for p in projects}


def compatible(version: str, base: str) -> bool:
    """`version` satisfies `~=base` (base X.Y.Z: >= base, == X.Y.*)."""
    v, b = parse_version(version), parse_version(base)
    return v >= b and v[:2] == b[:2]


def check(repo: Path, pants: str = "./pants") -> tuple[list[str], list[str]]:
    """(violations, notes) for the working tree of `repo`."""
    errors: list[str] = []
    notes: list[str] = []
    dependents = Dependents(repo, pants)
    current = packages(repo)
    dirs = set(current)
    for package in current.values():
        label = f"{package.dist} {package.version}"
        init = read(repo, f"{SRC}/{package.directory}/__init__.py", None) or ""
        dunder = DUNDER_VERSION.search(init)
        if dunder is None or dunder[1] != package.version:
            errors.append(
                f"{package.dist}: BUILD says {package.version}, __init__.py "
                f"{dunder[1] if dunder else 'has no __version__'}: make them equal"
            )
        if problem := changelog_problem(repo, package):
            errors.append(f"{package.dist}: {problem}")
        release = last_release(repo, package.dist)
        if release is None:
            notes.append(
                f"{label}: not released yet (no tag {package.dist}-v*); its first release is "
                f"the tag {package.dist}-v{package.version} on a commit where this check passes"
            )
            continue
        files = changed_files(repo, release.tag, package.directory)
        ranges = changed_ranges(repo, release.tag)
        if ranges:
            used = dependents.packages(ranges)
            files += [f"{REQUIREMENTS} ({p})" for p in ranges if package.directory in used[p]]
        tagged, now = parse_version(release.version), parse_version(package.version)
        breaking = breaking_changes(repo, release.tag, files)
        patch = f"{tagged[0]}.{tagged[1]}.{tagged[2] + 1}"
        minor = f"{tagged[0]}.{tagged[1] + 1}.0"
        if now < tagged:
            errors.append(f"{package.dist}: version {package.version} is below its release "
                          f"{release.tag}: set it above {release.version}")
        elif files and now == tagged:
            need = f"{minor} (breaking: {'; '.join(breaking)})" if breaking else f"{patch}"
            errors.append(
                f"{package.dist}: {len(files)} shipped file(s) changed since {release.tag} "
                f"({', '.join(files[:5])}{', ...' if len(files) > 5 else ''}) but the version is "
                f"still {package.version}: bump it to {need} in src/python/{package.directory}/"
                "BUILD and __init__.py, with a CHANGELOG.md section for it"
            )
        elif breaking and now[:2] == tagged[:2]:
            errors.append(
                f"{package.dist}: public API changed since {release.tag} "
                f"({'; '.join(breaking)}), which the ~={release.version} ranges of its users "
                f"admit: bump to {minor} (a new X.Y), not {package.version}"
            )
        elif files or now != tagged:
            notes.append(f"{label}: changed since {release.tag}, version bumped: ok")
        else:
            notes.append(f"{label}: unchanged since {release.tag}")
        # Its released wheel required `~=<dependency's version at the tag>` of each first-party
        # package it imports: does the dependency's version here still satisfy that?
        at_tag = packages(repo, release.tag)
        for dep in sorted(first_party_imports(repo, package.directory, release.tag, dirs)):
            if dep not in at_tag or dep not in current:
                continue
            base, dep_now = at_tag[dep].version, current[dep]
            if compatible(dep_now.version, base):
                continue
            if now == tagged:
                errors.append(
                    f"{package.dist}: released {release.tag} requires {dep_now.dist}~={base}, "
                    f"which {dep_now.dist} {dep_now.version} no longer satisfies: bump "
                    f"{package.dist} (to {patch} or above; its next wheel requires "
                    f"{dep_now.dist}~={dep_now.version}) and release both"
                )
            else:
                notes.append(
                    f"{label}: its release {release.tag} does not accept {dep_now.dist} "
                    f"{dep_now.version} (it requires ~={base}); release {package.dist} "
                    f"{package.version} together with it"
                )
    return errors, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="default: the cwd")
    parser.add_argument("--pants", default="./pants",
                        help="run when a requirements.txt range changed (default: ./pants)")
    args = parser.parse_args(argv)
    repo = Path(git(args.repo, "rev-parse", "--show-toplevel").strip())
    errors, notes = check(repo, args.pants)
    for note in notes:
        print(f"version-policy: {note}")
    for error in errors:
        print(f"version-policy: ERROR {error}", file=sys.stderr)
    if errors:
        print(f"version-policy: {len(errors)} violation(s); see docs/packaging.md, "
              "'Versions and releases'", file=sys.stderr)
        return 1
    print(f"version-policy: ok ({len(notes)} package(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())

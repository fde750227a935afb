"""What a change affects, according to Pants' dependency graph (run through build-support/affected).

Pants computes the affected set: `--changed-since=BASE --changed-dependents=transitive` maps the
changed files to their owning targets and adds everything that depends on them, transitively. This
script only groups that set for people and for CI: packages (one per `python_distribution`), test
targets (one per test file) by category tag, and the count against all test targets.

One rule is ours, not Pants': a few files configure every target without being part of the graph
(the launcher, pants.toml, the CI workflow, this script). Pants maps them to no target, or only
to the `file` targets that tests read them through, so a change to one would select next to
nothing; here it selects everything (GLOBAL_FILES).
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).absolute().parent.parent

# The CI test jobs select by these tags (`./pants --tag=<category> test`). A test target carries
# one of them; the first one listed here wins if it carries several.
CATEGORIES = ("unit", "op", "feature", "e2e")
UNCATEGORIZED = "uncategorized"

# Categories split further into one CI job per tag with this prefix: the op suite has one target
# per backend (and per HTP arch for QNN), tagged e.g. `backend-xnnpack` or `backend-qnn-v73`.
SHARD_TAG_PREFIX = {"op": "backend-"}

TEST_TARGET_TYPES = frozenset({"python_test"})
PACKAGE_TARGET_TYPE = "python_distribution"

# Files outside the dependency graph that can change the result of any lint, check or test.
GLOBAL_FILES = (
    "pants",
    "pants.toml",
    "pants.*.toml",
    "build-support/*",
    "ruff.toml",
    "mypy.ini",
    ".github/workflows/*",
)

BUILD_FILE_NAMES = frozenset({"BUILD", "BUILD.pants"})


class AffectedError(Exception):
    """A failure worth one line on stderr, not a traceback."""


@dataclass(frozen=True)
class Target:
    address: str
    target_type: str
    tags: tuple[str, ...]
    sources: tuple[str, ...]

    @property
    def category(self) -> str:
        return next((c for c in CATEGORIES if c in self.tags), UNCATEGORIZED)

    @property
    def shard_tag(self) -> str | None:
        prefix = SHARD_TAG_PREFIX.get(self.category)
        return next((t for t in self.tags if prefix and t.startswith(prefix)), None)

    @property
    def directory(self) -> str:
        return self.address.split(":", 1)[0]


@dataclass(frozen=True)
class Job:
    """One CI test job: the tests that `./pants <specs> <tag_args> test` selects."""

    name: str
    tag_args: str
    tests: int


def jobs_for(tests: list[Target], all_tests: list[Target]) -> list[Job]:
    """The CI test jobs for `tests`, split by category and, within a sharded category, by tag.

    `all_tests` supplies every shard tag in use, so a test without one (say a new backend whose
    target lacks its tag) still gets a job: the category minus all known shard tags.
    """
    jobs: list[Job] = []
    # No job for UNCATEGORIZED: nothing can select tests by a missing tag; --strict reports them.
    for category in CATEGORIES:
        in_category = [t for t in tests if t.category == category]
        if not in_category:
            continue
        if category not in SHARD_TAG_PREFIX:
            jobs.append(Job(category, f"--tag={category}", len(in_category)))
            continue
        known = sorted({s for t in all_tests if t.category == category and (s := t.shard_tag)})
        for shard in sorted({t.shard_tag for t in in_category if t.shard_tag}):
            n = sum(t.shard_tag == shard for t in in_category)
            jobs.append(Job(f"{category} {shard}", f"--tag={category} --tag={shard}", n))
        rest = [t for t in in_category if t.shard_tag is None]
        if rest:
            exclude = f" --tag=-{','.join(known)}" if known else ""
            jobs.append(Job(f"{category} (no shard tag)", f"--tag={category}{exclude}", len(rest)))
    return jobs


@dataclass(frozen=True)
class Report:
    base: str | None
    changed_files: tuple[str, ...]
    outside_graph: tuple[str, ...]
    global_changes: tuple[str, ...]
    run_all: bool
    pants_specs: tuple[str, ...]
    packages_all: tuple[str, ...]
    packages_affected: tuple[str, ...]
    tests_all: dict[str, list[str]]
    tests_affected: dict[str, list[str]]
    jobs: tuple[Job, ...]
    targets_affected: int

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.tests_all.values())

    @property
    def affected_count(self) -> int:
        return sum(len(v) for v in self.tests_affected.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "changed_files": list(self.changed_files),
            "outside_graph": list(self.outside_graph),
            "global_changes": list(self.global_changes),
            "run_all": self.run_all,
            "pants_specs": list(self.pants_specs),
            "targets_affected": self.targets_affected,
            "packages": {
                "affected": list(self.packages_affected),
                "all": list(self.packages_all),
            },
            "tests": {
                "affected": self.tests_affected,
                "affected_count": self.affected_count,
                "total": self.total,
                "total_by_category": {c: len(v) for c, v in self.tests_all.items()},
            },
            "categories": [c for c, v in self.tests_affected.items() if v],
            "jobs": [dataclasses.asdict(j) for j in self.jobs],
            "uncategorized": self.tests_all.get(UNCATEGORIZED, []),
        }


def git(*args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise AffectedError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def changed_files(base: str) -> list[str]:
    """The files Pants treats as changed for `--changed-since=base`, by the same git calls.

    Pants compares the merge base of `base` and HEAD (`base...HEAD`) and adds uncommitted and
    untracked files; reproducing that keeps our file list and Pants' target list in agreement.
    """
    if subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}"],
        capture_output=True,
        check=False,
    ).returncode:
        raise AffectedError(
            f"unknown base {base!r}: fetch it first (`git fetch origin`; in CI check out with "
            "fetch-depth: 0)"
        )
    files = set(git("diff", "--name-only", f"{base}...HEAD").splitlines())
    files.update(git("diff", "--name-only", "HEAD").splitlines())
    files.update(git("ls-files", "--others", "--exclude-standard", "--full-name").splitlines())
    return sorted(files)


def pants(*args: str) -> str:
    # Pants' own log lines go to our stderr untouched; only its stdout is the answer.
    proc = subprocess.run(
        [str(ROOT / "pants"), *args], cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False
    )
    if proc.returncode != 0:
        raise AffectedError(f"`./pants {' '.join(args)}` failed with exit code {proc.returncode}")
    return proc.stdout


def all_targets() -> list[Target]:
    raw: list[dict[str, Any]] = json.loads(pants("peek", "::"))
    return [
        Target(
            address=str(t["address"]),
            target_type=str(t["target_type"]),
            tags=tuple(t.get("tags") or ()),
            sources=tuple(t.get("sources") or ()),
        )
        for t in raw
    ]


def grouped(tests: list[Target]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {c: [] for c in CATEGORIES}
    for t in sorted(tests, key=lambda t: t.address):
        groups.setdefault(t.category, []).append(t.address)
    return groups


def package_name(dist: Target) -> str:
    return dist.directory.rsplit("/", 1)[-1]


def build_report(base: str | None) -> Report:
    changed = changed_files(base) if base is not None else []
    global_changes = [f for f in changed if any(fnmatch.fnmatch(f, g) for g in GLOBAL_FILES)]
    run_all = base is None or bool(global_changes)
    specs = ("::",) if run_all else (f"--changed-since={base}", "--changed-dependents=transitive")

    targets = all_targets()
    owned = {src for t in targets for src in t.sources}
    outside = [f for f in changed if f not in owned and Path(f).name not in BUILD_FILE_NAMES]
    if run_all:
        affected = {t.address for t in targets}
    elif any(f not in outside or not (ROOT / f).exists() for f in changed):
        affected = set(pants(*specs, "list").splitlines())
    else:
        # Only existing files that no target owns (or nothing at all) changed: Pants would select
        # nothing, so spare its second run (~15 s without pantsd). A deleted file still goes to
        # Pants, which matches it against its former owners' source globs.
        affected = set()
    tests = [t for t in targets if t.target_type in TEST_TARGET_TYPES]
    affected_tests = [t for t in tests if t.address in affected]
    dists = [t for t in targets if t.target_type == PACKAGE_TARGET_TYPE]
    return Report(
        base=base,
        changed_files=tuple(changed),
        outside_graph=tuple(outside),
        global_changes=tuple(global_changes),
        run_all=run_all,
        pants_specs=specs,
        packages_all=tuple(sorted(package_name(d) for d in dists)),
        packages_affected=tuple(sorted(package_name(d) for d in dists if d.address in affected)),
        tests_all=grouped(tests),
        tests_affected=grouped(affected_tests),
        jobs=tuple(jobs_for(affected_tests, tests)),
        targets_affected=len(affected),
    )


def percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def render(report: Report) -> str:
    lines: list[str] = []
    if report.base is None:
        lines.append("Everything (--all).")
    else:
        lines.append(
            f"Changes since {report.base} (merge base with HEAD, plus the working tree): "
            f"{len(report.changed_files)} file(s)"
        )
        outside = set(report.outside_graph)
        glob = set(report.global_changes)
        for f in report.changed_files:
            note = (
                "  [configures every target: everything is affected]"
                if f in glob
                else "  [no target owns it]"
                if f in outside
                else ""
            )
            lines.append(f"  {f}{note}")
    pkgs = ", ".join(report.packages_affected) or "none"
    lines.append(
        f"Affected packages ({len(report.packages_affected)} of {len(report.packages_all)}): {pkgs}"
    )
    lines.append(
        f"Affected test targets: {report.affected_count} of {report.total} "
        f"({percent(report.affected_count, report.total)})"
    )
    for category, all_in_category in report.tests_all.items():
        picked = report.tests_affected.get(category, [])
        if not all_in_category:
            continue
        lines.append(f"  {category}: {len(picked)} of {len(all_in_category)}")
        lines.extend(f"    {address}" for address in picked)
    uncategorized = report.tests_all.get(UNCATEGORIZED, [])
    if uncategorized:
        lines.append(
            f"WARNING: {len(uncategorized)} test target(s) carry none of the tags "
            f"{', '.join(CATEGORIES)}, so no CI test job runs them."
        )
    specs = " ".join(report.pants_specs)
    if report.jobs:
        lines.append("CI test jobs:")
        lines.extend(
            f"  {j.name} ({j.tests}): ./pants {specs} {j.tag_args} test" for j in report.jobs
        )
    lines.append(f"Run them all locally: ./pants {specs} test")
    return "\n".join(lines)


def write_github_output(report: Report, path: Path) -> None:
    data = report.to_json()
    with path.open("a", encoding="utf-8") as out:
        out.write(f"specs={' '.join(report.pants_specs)}\n")
        out.write(f"categories={json.dumps(data['categories'])}\n")
        out.write(f"run_all={'true' if report.run_all else 'false'}\n")
        out.write(f"tests={report.affected_count}\n")
        out.write(f"targets={report.targets_affected}\n")
        out.write(f"jobs={json.dumps(data['jobs'])}\n")
        out.write(f"packages={json.dumps(data['packages']['all'])}\n")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="build-support/affected",
        description="Print the packages and test targets a change affects, by Pants' graph.",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--base",
        default="origin/main",
        help="git ref to compare against (its merge base with HEAD); default: origin/main",
    )
    which.add_argument("--all", action="store_true", help="everything, as on main")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--github-output",
        type=Path,
        metavar="FILE",
        help="also append key=value lines for CI to FILE ($GITHUB_OUTPUT): specs, categories, "
        "run_all, tests, targets, jobs, packages",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 if a test target has no category tag (no CI job would run it)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        report = build_report(None if args.all else str(args.base))
    except AffectedError as e:
        print(f"affected: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=2) if args.json else render(report))
    if args.github_output is not None:
        write_github_output(report, args.github_output)
    if args.strict and report.tests_all.get(UNCATEGORIZED):
        print("affected: test targets without a category tag (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

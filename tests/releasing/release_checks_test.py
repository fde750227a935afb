"""build-support/release_package.py refuses a release before building or uploading anything:
a tag that is not a release tag, not HEAD, or not the BUILD's version; a package the version
policy fails; a wheel whose first-party range no release satisfies. On throwaway git repos, no
Pants (the round trip through a real index is release_test.py)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import release_package
from releasing.throwaway import commit, git, set_version, write


def refusal(repo: Path, *tags: str) -> str:
    with pytest.raises(release_package.ReleaseError) as info:
        release_package.plan(repo, list(tags))
    return str(info.value)


def test_the_tag_must_be_a_release_tag_of_a_known_package(released: Path) -> None:
    assert "expected <package>-v<X.Y.Z>" in refusal(released, "v0.1.0")
    assert "no package qnn-infer under src/python" in refusal(released, "qnn-infer-v0.1.0")


def test_the_tag_must_exist_be_head_and_match_the_build(released: Path) -> None:
    assert "BUILD says version 0.1.0; bump it to 0.1.1" in refusal(released, "qnn-quant-v0.1.1")
    write(released, "src/python/qnn_quant/api.py", "X = 1\n")
    set_version(released, "qnn_quant", "0.1.1")
    commit(released, "qnn-quant 0.1.1")
    assert "no such tag: `git tag qnn-quant-v0.1.1`" in refusal(released, "qnn-quant-v0.1.1")
    git(released, "tag", "qnn-quant-v0.1.1")
    write(released, "README.md", "later\n")
    commit(released, "a later commit")
    assert "check out the tag (what is built must be what was tagged)" in refusal(
        released, "qnn-quant-v0.1.1")


def test_a_release_the_policy_fails_is_refused(repo: Path) -> None:
    git(repo, "tag", "qnn-quant-v0.1.0")
    write(repo, "src/python/qnn_quant/CHANGELOG.md", "# qnn-quant\n")  # no ## 0.1.0 section
    commit(repo, "changelog lost")
    git(repo, "tag", "-f", "qnn-quant-v0.1.0")
    assert "the version policy fails: qnn-quant: src/python/qnn_quant/CHANGELOG.md has no " \
        "`## 0.1.0` section" in refusal(repo, "qnn-quant-v0.1.0")


def test_a_good_tag_is_planned(released: Path) -> None:
    (planned,) = release_package.plan(released, ["qnn-quant-v0.1.0"])
    assert (planned.package.dist, planned.package.version) == ("qnn-quant", "0.1.0")


def _wheel(path: Path, *requires: str) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("qnn_quant-0.2.0.dist-info/METADATA", "Metadata-Version: 2.1\n"
                    "Name: qnn-quant\nVersion: 0.2.0\n"
                    + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return path


def test_a_stage_needing_an_unreleased_qnn_common_is_refused(released: Path,
                                                            tmp_path: Path) -> None:
    (planned,) = release_package.plan(released, ["qnn-quant-v0.1.0"])
    wheel = _wheel(tmp_path / "w.whl", "qnn-common (~=0.2.0)", "torch (<2.14,>=2.13)",
                   "qnn-common[qnn-dev-sdk] ; extra == 'qnn-dev-sdk'")
    assert release_package.first_party_requirements(wheel) == [("qnn-common", "0.2.0")]
    with pytest.raises(release_package.ReleaseError, match=r"requires qnn-common~=0.2.0, and no "
                       r"qnn-common release satisfies it \(tags: qnn-common-v0.1.0\): release "
                       r"qnn-common 0.2.0 first \(tag qnn-common-v0.2.0\)"):
        release_package.check_dependencies_released(released, [planned], {planned.tag: [wheel]})
    git(released, "tag", "qnn-common-v0.2.0")
    release_package.check_dependencies_released(released, [planned], {planned.tag: [wheel]})

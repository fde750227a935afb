"""File digests memoized per process: hashed once, never answered stale after a change."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from qnn_common.sealing import load_manifest, write_manifest
from qnn_common.store import hashing
from qnn_common.store.hashing import RACY_NS, clear_digest_memo, hashed_count, sha256_file

# Long enough after a write that the file's timestamps are outside the racy window.
SETTLE_S = 2 * RACY_NS / 1e9


@pytest.fixture(autouse=True)
def _fresh_memo() -> None:
    clear_digest_memo()


def _settled(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    time.sleep(SETTLE_S)
    return path


def test_digest_is_sha256_of_the_content(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)  # several read chunks
    path = _settled(tmp_path / "f.bin", data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_an_unchanged_file_is_read_once(tmp_path: Path) -> None:
    path = _settled(tmp_path / "f.bin", b"abc" * 1000)
    before = hashed_count()
    first = sha256_file(path)
    assert sha256_file(path) == first
    assert sha256_file(Path(os.path.relpath(path))) == first  # same file, other spelling
    assert hashed_count() == before + 1


def test_rewrite_in_place_same_size_same_mtime_is_hashed_again(tmp_path: Path) -> None:
    """The case a (path, size, mtime) key gets wrong: ctime still tells."""
    path = _settled(tmp_path / "f.bin", b"a" * 4096)
    st = path.stat()
    assert sha256_file(path) == hashlib.sha256(b"a" * 4096).hexdigest()
    with open(path, "r+b") as fh:  # same inode, same size
        fh.write(b"b" * 4096)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the old mtime back
    now = path.stat()
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    assert sha256_file(path) == hashlib.sha256(b"b" * 4096).hexdigest()


def test_replaced_file_same_size_is_hashed_again(tmp_path: Path) -> None:
    path = _settled(tmp_path / "f.bin", b"a" * 100)
    st = path.stat()
    sha256_file(path)
    other = _settled(tmp_path / "g.bin", b"c" * 100)
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, path)  # new inode under the same name
    assert sha256_file(path) == hashlib.sha256(b"c" * 100).hexdigest()


def test_a_just_written_file_is_not_remembered(tmp_path: Path) -> None:
    """Racy: a rewrite within the same timestamp tick could keep every stat field."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"fresh")
    before = hashed_count()
    sha256_file(path)
    sha256_file(path)
    assert hashed_count() == before + 2
    assert str(path.resolve()) not in hashing._memo


def test_sealing_then_verifying_twice_hashes_each_file_once(tmp_path: Path) -> None:
    art = tmp_path / "art"
    art.mkdir()
    for name in ("a.bin", "b.bin"):
        (art / name).write_bytes(name.encode() * 1000)
    time.sleep(SETTLE_S)
    before = hashed_count()
    write_manifest(art, stage="prepare", package="p", package_version="0", config={},
                   inputs={}, files=["a.bin", "b.bin"], cache_key="k")
    load_manifest(art)
    load_manifest(art)
    assert hashed_count() == before + 2


def test_verification_still_catches_a_change_after_the_memo(tmp_path: Path) -> None:
    from qnn_common.errors import ArtifactError

    art = tmp_path / "art"
    art.mkdir()
    (art / "a.bin").write_bytes(b"x" * 64)
    time.sleep(SETTLE_S)
    write_manifest(art, stage="prepare", package="p", package_version="0", config={},
                   inputs={}, files=["a.bin"], cache_key="k")
    load_manifest(art)
    st = (art / "a.bin").stat()
    with open(art / "a.bin", "r+b") as fh:
        fh.write(b"y")
    os.utime(art / "a.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ArtifactError, match="sha256"):
        load_manifest(art)

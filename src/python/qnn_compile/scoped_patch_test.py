"""A scoped patch is in place exactly while some block is open, and leaves its owners as found."""

from __future__ import annotations

import threading

import pytest

from qnn_compile.scoped_patch import ScopedPatch


class _Base:
    def inherited(self) -> str:
        return "base"


class _Owner(_Base):
    def own(self) -> str:
        return "stock"


def _ours(self: _Owner) -> str:
    return "ours"


def _patch() -> ScopedPatch:
    return ScopedPatch(lambda: [(_Owner, "own", _ours), (_Owner, "inherited", _ours)])


def test_installed_while_any_block_is_open_then_restored_exactly() -> None:
    stock = vars(_Owner)["own"]
    patch = _patch()
    with patch.active():
        with patch.active():
            assert (_Owner().own(), _Owner().inherited()) == ("ours", "ours")
            assert patch.original("own") is stock
        assert _Owner().own() == "ours"  # the outer block still holds it
    assert vars(_Owner)["own"] is stock
    assert "inherited" not in vars(_Owner)  # it was the base's: deleted, not copied down
    assert _Owner().inherited() == "base"
    assert not patch.installed()


def test_restored_after_an_error() -> None:
    patch = _patch()
    with pytest.raises(RuntimeError), patch.active():
        raise RuntimeError("lowering failed")
    assert _Owner().own() == "stock"
    assert not patch.installed()


def test_threads_share_one_installation() -> None:
    patch = _patch()
    inside, leave = threading.Event(), threading.Event()

    def lowering() -> None:
        with patch.active():
            inside.set()
            leave.wait(10)

    other = threading.Thread(target=lowering)
    other.start()
    assert inside.wait(10)
    with patch.active():
        pass
    assert _Owner().own() == "ours"  # the other thread's lowering is still running
    leave.set()
    other.join(10)
    assert _Owner().own() == "stock"


def test_no_replacements_changes_nothing() -> None:
    patch = ScopedPatch(lambda: [])
    with patch.active():
        assert not patch.installed()
    assert _Owner().own() == "stock"


class _Importer:
    """A second owner of the same name, as a module that did `from owner import own` is."""

    own = vars(_Owner)["own"]


def test_one_name_on_several_owners_each_restored_original_from_the_first() -> None:
    stock = vars(_Owner)["own"]
    patch = ScopedPatch(lambda: [(_Owner, "own", _ours), (_Importer, "own", _ours)])
    with patch.active():
        assert (_Owner().own(), _Importer().own()) == ("ours", "ours")
        assert patch.original("own") is stock
    assert vars(_Owner)["own"] is stock and vars(_Importer)["own"] is stock

"""Loading a torch.save file from outside: bounded before torch reads it, never unpickled freely.

Three checks run before `torch.load(weights_only=True)` gets the file, each from what the file
declares, before the work it would cost is done:

- the zip archive's headers (`bounded_zip`): canonical unique names, no overlapping members,
  compressed members inflating to at most `bounded_zip.INFLATED_BUDGET` in all. torch inflates a
  deflated member to the size its header declares, so without this a 4 MB file takes gigabytes
  before anything could refuse it. torch.save stores its members uncompressed: one is at most
  the file's size.
- the pickle (`data.pkl`): at most `MAX_PICKLE_BYTES`, and the object graph it builds bounded
  (`pickle_shape`): shared children counted once, expansions, depth and self-references refused.
- torch's weights-only unpickler: only tensors, containers and plain values.

When torch refuses a file its message advises retrying with ``weights_only=False``, which runs
any code the file holds; it never reaches users. They get what is wrong and what to do instead.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import BinaryIO

import torch

from qnn_common.errors import ArtifactError
from qnn_common.torchio.bounded_zip import gib, open_bounded_zip
from qnn_common.torchio.pickle_shape import PickleShapeError, scan_pickle

# An honest file's pickle holds its structure only (tensor bytes are separate members): about a
# hundred bytes per tensor.
MAX_PICKLE_BYTES = 16 * 2**20
_PICKLE = "data.pkl"
SAVE_PLAIN = (
    "save plain tensors (and tuples, lists, str-keyed dicts of them) with torch.save; files are "
    "never unpickled without restriction, as that could run code in them"
)
# The reason inside torch's weights-only refusal, without its advice to drop the restriction.
_REASON = re.compile(r"^(?:WeightsUnpickler error: )?(.*?)(?:\.|$)", re.MULTILINE)


def load_tensor_file(path: Path, *, what: str) -> object:
    """What the torch.save file at `path` holds, loaded weights-only after the checks above;
    ArtifactError naming the file, what is wrong and what to do otherwise. `what` names what
    the file must be (e.g. "a file of samples") in messages."""
    if not path.is_file():
        raise ArtifactError(path, "does not exist")
    try:
        with path.open("rb") as file:
            return load_tensor_stream(path, file, what=what)
    except OSError as err:
        raise ArtifactError(path, f"cannot be read: {err.strerror or err}") from None


def load_tensor_stream(path: Path, file: BinaryIO, *, what: str) -> object:
    """`load_tensor_file` on a file already open (`path` names it in messages)."""
    size = file.seek(0, io.SEEK_END)
    file.seek(0)
    remedy = SAVE_PLAIN
    with open_bounded_zip(path, file, size, what=f"{what} saved by torch.save",
                          remedy=remedy) as archive:
        info = archive.members.get(_PICKLE)
        if info is None:
            raise ArtifactError(
                path, f"is not {what} saved by torch.save (the archive has no {_PICKLE}); {remedy}"
            )
        if info.file_size > MAX_PICKLE_BYTES:
            raise ArtifactError(
                path, f"{_PICKLE}: its structure takes {gib(info.file_size)}, over the "
                f"{gib(MAX_PICKLE_BYTES)} this reads; split the samples into smaller files",
            )
        try:
            shape = scan_pickle(archive.read(_PICKLE))
        except PickleShapeError as err:
            raise ArtifactError(path, f"{_PICKLE}: {err}; {remedy}") from None
    file.seek(0)
    try:
        return torch.load(file, weights_only=True, map_location="cpu")
    except Exception as err:  # pickle, zip, storage and weights-only errors share no base class
        raise ArtifactError(path, _refusal(err, shape.globals, what)) from None


def _refusal(err: Exception, globals_: tuple[str, ...], what: str) -> str:
    """Our message for torch's refusal: its reason, not its advice."""
    text = str(err)
    if "weights_only" in text or "Weights only" in text:
        foreign = [g for g in globals_ if not g.startswith(("torch.", "collections."))]
        reason = (
            f"it names {', '.join(foreign[:3])}, which only an unrestricted unpickler would load"
            if foreign else _reason(text)
        )
        return f"holds more than tensors and plain values ({reason}); {SAVE_PLAIN}"
    lines = [line for line in text.strip().splitlines() if "weights_only" not in line]
    first = lines[0][:200] if lines else type(err).__name__
    return f"cannot be read as {what} ({first}); {SAVE_PLAIN}"


def _reason(text: str) -> str:
    """The line of torch's weights-only message that says what it refused."""
    for line in text.splitlines():
        line = line.strip()
        if not line or "weights_only" in line or line.startswith(("Weights only", "Check the")):
            continue
        match = _REASON.match(line)
        if match and match.group(1):
            return match.group(1)[:200]
    return "the weights-only unpickler refused it"

"""How much memory the rehearsal of a foreign program may take: a cap, set in the child.

ExecuTorch allocates what a program's memory plan asks for. One flipped byte in a planned
buffer's size made the runtime allocate about 20 GB in the rehearsal child (issue 49), and then
the same again in-process. The rehearsal child (`qnn_infer.isolation`) therefore runs under
RLIMIT_DATA: past the cap an allocation fails (the runtime's `std::bad_alloc` reaches Python as
a MemoryError) instead of taking the machine's memory, and the program is refused unrun.

RLIMIT_DATA, not RLIMIT_AS: it counts the private writable memory a process maps (its heap and
anonymous mappings), which is what an allocation bomb grows, and not address space merely
reserved (thread stacks' guards, malloc arenas, whatever a QNN library reserves), which would
make an address-space cap either useless or a false alarm. The cap is the child's data size at the
fork plus a budget: `DEFAULT_FLOOR_BYTES`, or more for a large program (a runtime holds the
program, the weights a delegate repacks and the planned activations), never more than the
machine's memory. `QNN_REHEARSAL_MEMORY_MB` sets the budget instead (0: no cap), for a program you
trust that needs more. Linux only: where /proc/self/status is missing the child runs uncapped.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

from qnn_common.errors import ConfigValidationError

MEMORY_ENV = "QNN_REHEARSAL_MEMORY_MB"
# A budget above any program this pipeline makes for the host (SmolLM2-135M's infer stage peaks
# at 1.0 GiB in all), far below the machine's memory a corrupt plan can ask for.
DEFAULT_FLOOR_BYTES = 2 << 30
# Beyond the floor, this many bytes per byte of the program: the program, the weights a
# delegate repacks from it and their working copies.
_PER_PROGRAM_BYTE = 4
_MIB = 1 << 20
# Larger budgets are refused as typos (1 PiB): 0 is how to say "no cap".
_MAX_MB = 1 << 30


def rehearsal_budget(pte: Path) -> int | None:
    """Bytes the rehearsal of `pte` may allocate beyond what the process holds at the fork (None:
    no cap). Raises ConfigValidationError for a bad QNN_REHEARSAL_MEMORY_MB."""
    raw = os.environ.get(MEMORY_ENV, "").strip()
    if raw:
        try:
            mb = int(raw)
        except ValueError:
            mb = -1
        if not 0 <= mb <= _MAX_MB:
            raise ConfigValidationError(
                MEMORY_ENV, raw, f"give the MiB a foreign program's rehearsal may allocate, "
                f"0 to {_MAX_MB} (0 = no cap)"
            )
        return mb * _MIB or None
    wanted = DEFAULT_FLOOR_BYTES + _PER_PROGRAM_BYTE * pte.stat().st_size
    machine = _physical_memory()
    return min(wanted, machine) if machine else wanted


def describe(budget: int) -> str:
    """`budget` as a person reads it: "2.0 GiB", "64 MiB"."""
    if budget < 1 << 30:
        return f"{budget / _MIB:.0f} MiB"
    return f"{budget / (1 << 30):.1f} GiB"


def cap_this_process(budget: int) -> bool:
    """Limit this process's data size to what it holds now plus `budget`; whether it could."""
    held = _data_bytes()
    if held is None:
        return False
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = held + budget
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    return True


def _data_bytes() -> int | None:
    """This process's data size (VmData: what RLIMIT_DATA counts), or None off Linux."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0

"""Where a program's time goes, op by op: the runs' ETDump read by ExecuTorch's Inspector into a
table (the op or delegate kernel, whether a delegate ran it, its time per run and its share of
`Method::execute`), written beside the run as profile.md and profile.json. The first thing a
performance engineer looks at: which kernels dominate, and what runs outside the delegate."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from qnn_common.store.atomic import atomic_write_text

PROFILE_MD, PROFILE_JSON = "profile.md", "profile.json"
# The events that are not an op: the method as a whole, and the hand-over to a delegate (what
# its kernels took plus the call's own cost).
EXECUTE, DELEGATE_CALL = "Method::execute", "DELEGATE_CALL"


@dataclass(frozen=True)
class OpTime:
    """One op's (or delegate kernel's) time, over the traced runs: `per_run_ms` all its calls
    in one run take (an op name a program calls several times sums them), `p50_ms` one call's
    median."""

    name: str
    delegated: bool
    calls_per_run: float
    per_run_ms: float
    p50_ms: float
    share: float  # of Method::execute's mean, 0..1


@dataclass(frozen=True)
class Profile:
    """A program's traced runs: the method's time, its delegate calls', and each op's."""

    runs: int
    execute_ms: float
    delegate_call_ms: float
    load_ms: float
    ops: tuple[OpTime, ...]

    @property
    def outside_delegates_ms(self) -> float:
        return sum(op.per_run_ms for op in self.ops if not op.delegated)

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "execute_ms": round(self.execute_ms, 4),
                "delegate_call_ms": round(self.delegate_call_ms, 4),
                "outside_delegates_ms": round(self.outside_delegates_ms, 4),
                "load_ms": round(self.load_ms, 3),
                "ops": [{**asdict(op), "calls_per_run": round(op.calls_per_run, 2),
                         "per_run_ms": round(op.per_run_ms, 4), "p50_ms": round(op.p50_ms, 4),
                         "share": round(op.share, 4)}
                        for op in self.ops]}


def read_profile(etdump: Path) -> Profile:
    """The table of `etdump` (every run it traced: the warmup and timed runs too)."""
    from executorch.devtools import Inspector  # pandas and the devtools: only when profiling

    inspector = Inspector(etdump_path=str(etdump))
    rows: dict[str, tuple[bool, list[float]]] = {}
    execute: list[float] = []
    delegate: list[float] = []
    load = 0.0
    for block in inspector.event_blocks:
        for event in block.events:
            perf = event.perf_data
            if perf is None:
                continue
            times = [float(t) for t in perf.raw]
            if block.name != "Execute":
                load += float(sum(times))  # Program::load_method, Method::init
            elif event.name == EXECUTE:
                execute += times
            elif event.name == DELEGATE_CALL:
                delegate += times
            else:
                _, seen = rows.setdefault(event.name, (bool(event.is_delegated_op), []))
                seen.extend(times)
    runs = len(execute)
    if not runs:
        raise ValueError(f"{etdump} traced no run of a method (no {EXECUTE} event)")
    execute_ms = _mean(execute)
    ops = sorted(
        (OpTime(name, delegated, len(times) / runs, sum(times) / runs, _median(times),
                sum(times) / runs / execute_ms if execute_ms else 0.0)
         for name, (delegated, times) in rows.items()),
        key=lambda op: -op.per_run_ms)
    return Profile(runs, execute_ms, sum(delegate) / runs, load, tuple(ops))


def write_method_profiles(etdumps: Mapping[str, Path], out: Path, program: str
                          ) -> dict[str, Profile]:
    """A causal LM's profile.md and profile.json, one table per method: each ETDump in
    `etdumps` traced that method alone (a decode step, a prefill window), so each table's
    shares are of that method's time."""
    profiles = {method: read_profile(path) for method, path in etdumps.items()}
    atomic_write_text(out / PROFILE_JSON, json.dumps(
        {method: p.to_json() for method, p in profiles.items()}, indent=2) + "\n")
    atomic_write_text(out / PROFILE_MD, "\n".join(
        markdown(p, f"{program}, method {method}") for method, p in profiles.items()))
    return profiles


def summary(profile: Profile) -> dict[str, Any]:
    """What the infer manifest's metrics keep of a profile: the method's time, the time outside
    any delegate, the three costliest ops."""
    return {"execute_ms": round(profile.execute_ms, 4),
            "outside_delegates_ms": round(profile.outside_delegates_ms, 4),
            "top": [op.name for op in profile.ops[:3]]}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def markdown(profile: Profile, program: str, top: int = 40) -> str:
    lines = [
        f"# Profile: {program}",
        "",
        f"{profile.runs} traced runs (warmup and timed; tracing slows them); per run: "
        f"`Method::execute` {profile.execute_ms:.4f} ms, delegate calls "
        f"{profile.delegate_call_ms:.4f} ms, ops outside any delegate "
        f"{profile.outside_delegates_ms:.4f} ms; loading {profile.load_ms:.3f} ms once.",
        "",
        "| op / kernel | where | calls per run | ms per run | p50 ms per call "
        "| share of execute |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for op in profile.ops[:top]:
        where = "delegate" if op.delegated else "**outside**"
        lines.append(f"| {op.name} | {where} | {op.calls_per_run:g} | {op.per_run_ms:.4f} "
                     f"| {op.p50_ms:.4f} | {100 * op.share:.1f} % |")
    if len(profile.ops) > top:
        lines.append(f"| ... {len(profile.ops) - top} more in {PROFILE_JSON} | | | | | |")
    return "\n".join(lines) + "\n"


def write_profile(etdump: Path, out: Path, program: str) -> Profile:
    """profile.md and profile.json of `etdump` into `out`; the profile."""
    profile = read_profile(etdump)
    atomic_write_text(out / PROFILE_JSON, json.dumps(profile.to_json(), indent=2) + "\n")
    atomic_write_text(out / PROFILE_MD, markdown(profile, program))
    return profile

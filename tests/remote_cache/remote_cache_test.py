"""Pants' remote cache over REAPI, for real: BuildGrid on loopback, the project's pants.remote.toml.

A throwaway repo (the real launcher and the real pants.toml's environment settings, as in
tests/affected) holds two pytest targets whose tests append a line to a file outside the sandbox
each time they execute. Run 1 (empty local store) executes them and writes the results to the
server; run 2, with a new empty local store and named caches (a clean machine), must execute no
test: every result comes from the remote cache, as Pants' counters and the tests' own log say.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from affected.affected_test import PEX_NAME, ROOT, pants_env, synthetic_pants_toml
from remote_cache.buildgrid_server import Server, buildgrid

from support.schedule import scheduled

TEST_SOURCE = '''\
from pathlib import Path

from calc.ops import add

EXECUTIONS = Path({log!r})


def _executed(name: str) -> None:
    with EXECUTIONS.open("a") as f:
        f.write(name + "\\n")


def test_{name}() -> None:
    _executed("{name}")
    assert add(2, 3) == 5
'''


def _repo(root: Path, executions: Path) -> None:
    files = {
        "BUILD": "",
        "pants.toml": synthetic_pants_toml(),
        "src/python/calc/BUILD": 'python_sources()\n\npython_tests(name="tests")\n',
        "src/python/calc/__init__.py": "",
        "src/python/calc/ops.py": "def add(a: int, b: int) -> int:\n    return a + b\n",
        "src/python/calc/add_test.py": TEST_SOURCE.format(log=str(executions), name="add"),
        "src/python/calc/sum_test.py": TEST_SOURCE.format(log=str(executions), name="sum"),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for name in ("pants", "pants.remote.toml", "build-support/pants-requirements.txt"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, root / name)
    (root / "pants").chmod(0o755)


def _counters(stderr: str) -> dict[str, int]:
    """Pants' `--stats-log` counters ("  remote_cache_requests_cached: 3")."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^\s+([a-z_]+): (\d+)$", stderr, re.M)}


class Run:
    def __init__(self, seconds: float, stdout: str, stderr: str) -> None:
        self.seconds, self.stdout, self.stderr = seconds, stdout, stderr
        self.counters = _counters(stderr)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, dict[str, str],
                                                                      Server]]:
    tmp = tmp_path_factory.mktemp("remote_cache")
    root, executions = tmp / "repo", tmp / "executions.log"
    _repo(root, executions)
    home = Path(os.environ.get("HOME", tmp))
    cache = Path(os.environ.get("QNN_PANTS_CACHE", home / ".cache" / "qnn-pants"))
    kept_pex = cache / "affected-test" / PEX_NAME  # shared with tests/affected
    bootstrap_pex = root / "build-support" / ".bootstrap" / PEX_NAME
    if kept_pex.is_file():
        bootstrap_pex.parent.mkdir(parents=True)
        shutil.copy2(kept_pex, bootstrap_pex)
    env = pants_env(cache, tmp)
    with buildgrid(cache, tmp / "buildgrid", env) as server:
        print(f"BuildGrid listening after {server.startup_seconds:.1f} s at {server.address}")
        env.update(
            PANTS_CONFIG_FILES="+['pants.remote.toml']",  # + : added to pants.toml, not instead
            QNN_REMOTE_CACHE_ADDRESS=server.address,
            QNN_REMOTE_CACHE_INSTANCE=server.instance,
            QNN_REMOTE_CACHE_TOKEN=server.token,
        )
        yield root, executions, env, server
    if not kept_pex.is_file() and bootstrap_pex.is_file():
        kept_pex.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(bootstrap_pex, kept_pex)


def _pants_test(root: Path, env: dict[str, str], store: Path) -> Run:
    """`./pants test ::` with a local store and named caches of its own (empty: a clean clone)."""
    env = {**env, "PANTS_LOCAL_STORE_DIR": str(store / "lmdb_store"),
           "PANTS_NAMED_CACHES_DIR": str(store / "named_caches")}
    start = time.monotonic()
    proc = subprocess.run(
        ["./pants", "--stats-log", "test", "::"], cwd=root, env=env, capture_output=True,
        text=True, timeout=600, check=False,
    )
    run = Run(time.monotonic() - start, proc.stdout, proc.stderr)
    print(f"./pants test with store {store.name}: exit {proc.returncode} in {run.seconds:.1f} s")
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    return run


@scheduled("a BuildGrid server and two clean Pants runs, about two minutes; it tests CI's "
           "cache, not the product")
def test_a_clean_machine_takes_test_results_from_the_remote_cache(
    setup: tuple[Path, Path, dict[str, str], Server], tmp_path: Path
) -> None:
    root, executions, env, server = setup
    # The server demands the token that pants.remote.toml sends from the environment.
    assert "anonymous: UNAUTHENTICATED" in server.probe, server.probe
    assert "with token: OK True" in server.probe, server.probe

    first = _pants_test(root, env, tmp_path / "first")
    assert sorted(executions.read_text().split()) == ["add", "sum"]
    assert first.counters.get("remote_cache_write_successes", 0) > 0, first.stderr
    assert first.counters.get("remote_cache_write_errors", 0) == 0, first.stderr

    # A new machine: nothing local, everything from the server.
    second = _pants_test(root, env, tmp_path / "second")
    assert sorted(executions.read_text().split()) == ["add", "sum"], "a test executed again"
    assert second.counters.get("remote_cache_requests_cached", 0) > 0, second.stderr
    assert second.counters.get("remote_cache_read_errors", 0) == 0, second.stderr
    for name in ("add", "sum"):
        assert re.search(rf"{name}_test.py:tests succeeded in \S+ \(cached remotely\)",
                         second.stderr), second.stderr
    print(f"run 1 {first.seconds:.1f} s, run 2 (clean store, remote cache) {second.seconds:.1f} s")
    print("run 2 counters:", {k: v for k, v in second.counters.items()
                              if k.startswith(("remote_", "local_"))})

"""build-support/affected selects the tests a change can break, and only those.

A throwaway git repo mirrors this one: the same launcher and Pants settings, `unit` tags from
`__defaults__`, stage packages that import qnn_common only, a pipeline that imports the stages, and
op (one target per backend) / feature / e2e suites importing single packages. Each scenario commits
one change on top of a base commit and runs the real script with `--base HEAD~1`, which runs Pants.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

# The repo root (in a Pants sandbox too, where the BUILD dependencies put these files).
ROOT = Path(__file__).resolve().parents[2]
PEX_NAME = "pex-v2.1.137"

BUILD_STAGE = """\
python_sources()

python_tests(name="tests")

python_distribution(
    name="dist",
    dependencies=[":{pkg}"],
    provides=python_artifact(name="{dist}", version="0.1.0"),
)
"""

# path -> contents. Imports are what matter: Pants infers the dependency graph from them.
FILES: dict[str, str] = {
    "README.md": "# synthetic monorepo\n",
    ".gitignore": "/.pants.d/\n/.pids/\n/.pants.workdir.file_lock*\n/build-support/.bootstrap/\n"
    "__pycache__/\n",
    "BUILD": "",
    "src/python/BUILD": '__defaults__({python_tests: dict(tags=["unit"])})\n',
    "src/python/qnn_common/__init__.py": "",
    "src/python/qnn_common/contracts.py": "STAGES = ('prepare', 'quantize', 'compile', 'infer')\n",
    "src/python/qnn_common/contracts_test.py": "from qnn_common.contracts import STAGES\n\n\n"
    "def test_stages() -> None:\n    assert STAGES\n",
    "src/python/qnn_quant/__init__.py": "",
    "src/python/qnn_quant/api.py": "from qnn_common.contracts import STAGES\n\n\n"
    "def quantize() -> str:\n    return STAGES[1]\n",
    "src/python/qnn_quant/api_test.py": "from qnn_quant.api import quantize\n\n\n"
    "def test_quantize() -> None:\n    assert quantize()\n",
    "src/python/qnn_infer/__init__.py": "",
    "src/python/qnn_infer/api.py": "from qnn_common.contracts import STAGES\n\n\n"
    "def infer() -> str:\n    return STAGES[3]\n",
    "src/python/qnn_infer/api_test.py": "from qnn_infer.api import infer\n\n\n"
    "def test_infer() -> None:\n    assert infer()\n",
    "src/python/qnn_pipeline/__init__.py": "",
    "src/python/qnn_pipeline/orchestrator.py": "from qnn_infer.api import infer\n"
    "from qnn_quant.api import quantize\n\n\n"
    "def run() -> list[str]:\n    return [quantize(), infer()]\n",
    "src/python/qnn_pipeline/orchestrator_test.py": "from qnn_pipeline.orchestrator import run\n"
    "\n\ndef test_run() -> None:\n    assert run()\n",
    # The real op suite's layout: one target per backend, tagged so CI gives each its own job.
    "tests/op/BUILD": 'python_tests(name="xnnpack", sources=["xnnpack_test.py"], '
    'tags=["op", "backend-xnnpack"])\n'
    'python_tests(name="portable", sources=["portable_test.py"], '
    'tags=["op", "backend-portable"])\n',
    "tests/op/xnnpack_test.py": "from qnn_quant.api import quantize\n",  # 8a8w: quantizes
    "tests/op/portable_test.py": "from qnn_infer.api import infer\n",  # fp32 only
    "tests/feature/BUILD": 'python_tests(name="tests", tags=["feature"])\n',
    "tests/feature/quant_report_test.py": "from qnn_quant.api import quantize\n",
    "tests/feature/infer_latency_test.py": "from qnn_infer.api import infer\n",
    "tests/e2e/BUILD": 'python_tests(name="tests", tags=["e2e"])\n',
    "tests/e2e/pipeline_test.py": "from qnn_pipeline.orchestrator import run\n",
}
for _pkg in ("qnn_common", "qnn_quant", "qnn_infer", "qnn_pipeline"):
    FILES[f"src/python/{_pkg}/BUILD"] = BUILD_STAGE.format(pkg=_pkg, dist=_pkg.replace("_", "-"))

UNIT = {
    pkg: f"src/python/{pkg}/{name}_test.py:tests"
    for pkg, name in [
        ("qnn_common", "contracts"),
        ("qnn_quant", "api"),
        ("qnn_infer", "api"),
        ("qnn_pipeline", "orchestrator"),
    ]
}
OP_XNNPACK = "tests/op/xnnpack_test.py:xnnpack"
OP_PORTABLE = "tests/op/portable_test.py:portable"
FEATURE_QUANT = "tests/feature/quant_report_test.py:tests"
FEATURE_INFER = "tests/feature/infer_latency_test.py:tests"
E2E = "tests/e2e/pipeline_test.py:tests"
ALL_TESTS = {*UNIT.values(), OP_XNNPACK, OP_PORTABLE, FEATURE_QUANT, FEATURE_INFER, E2E}
ALL_PACKAGES = ["qnn_common", "qnn_infer", "qnn_pipeline", "qnn_quant"]


def toml_lines(table: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Just enough TOML for pants.toml: strings, booleans, lists of strings, dotted keys."""
    for key, value in table.items():
        if isinstance(value, Mapping):
            yield from toml_lines(value, f"{prefix}{key}.")
        elif isinstance(value, bool):
            yield f"{prefix}{key} = {'true' if value else 'false'}"
        elif isinstance(value, list):
            # One item a line, as in the real file: the launcher greps [pex-cli] line by line.
            yield f"{prefix}{key} = ["
            yield from (f"  {json.dumps(item)}," for item in value)
            yield "]"
        else:
            yield f"{prefix}{key} = {json.dumps(value)}"


def synthetic_pants_toml() -> str:
    """The real pants.toml's environment settings, with a Python backend and no lockfiles.

    Taken from the real file rather than copied by hand, so the synthetic repo bootstraps and
    reaches PyPI the same way the real one does.
    """
    real = tomllib.loads((ROOT / "pants.toml").read_text())
    glob = real["GLOBAL"]
    config: dict[str, Mapping[str, Any]] = {
        "GLOBAL": {
            "pants_version": glob["pants_version"],
            "backend_packages": ["pants.backend.python"],
            **{k: glob[k] for k in ("ca_certs_path",) if k in glob},
            "pants_ignore": {"add": ["/build-support/.bootstrap/"]},
        },
        "source": {"root_patterns": ["/src/python", "/tests"]},
        "python": {"interpreter_constraints": real["python"]["interpreter_constraints"]},
        "anonymous-telemetry": {"enabled": False},
    }
    for section in ("python-bootstrap", "python-infer", "subprocess-environment", "pex-cli"):
        if section in real:
            config[section] = real[section]
    out: list[str] = []
    for section, table in config.items():
        out += [f"[{section}]", *toml_lines(table), ""]
    return "\n".join(out)


class Repo:
    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=self.root, env=self.env, check=True, capture_output=True, text=True
        ).stdout

    def commit_change(self, path: str, text: str) -> None:
        """Start from the base commit, append `text` to `path`, and commit it as HEAD."""
        self.git("checkout", "--quiet", "-B", "scenario", "base")
        with (self.root / path).open("a") as f:
            f.write(text)
        self.git("commit", "--quiet", "-am", f"change {path}")

    def affected(self) -> dict[str, Any]:
        start = time.monotonic()
        proc = subprocess.run(
            ["build-support/affected", "--base", "HEAD~1", "--json", "--strict"],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        print(f"build-support/affected took {time.monotonic() - start:.1f} s")
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        result: dict[str, Any] = json.loads(proc.stdout)
        return result


def pants_env(home_cache: Path, tmp: Path) -> dict[str, str]:
    # Our own interpreter is a PEX venv: its PEX_* variables and the outer Pants' settings must
    # not leak into the nested Pants (PANTS_PYTHON39 is the launcher's, not Pants'). The outer
    # [subprocess-environment] PIP_CONFIG_FILE=/dev/null would also drop /etc/pip.conf's cert,
    # which the launcher's pip relies on.
    env = {
        k: v
        for k, v in os.environ.items()
        if k == "PANTS_PYTHON39"
        or (
            not k.startswith(("PEX_", "__PEX", "PANTS_", "PYTEST_"))
            and k not in {"VIRTUAL_ENV", "PIP_CONFIG_FILE"}
        )
    }
    env.update(
        PANTS_PANTSD="false",  # nothing may outlive the test
        PANTS_DYNAMIC_UI="false",
        # A store of its own: the nested Pants shares no LMDB store with the Pants running us.
        PANTS_LOCAL_STORE_DIR=str(tmp / "lmdb_store"),
        PANTS_NAMED_CACHES_DIR=str(tmp / "named_caches"),
        GIT_AUTHOR_NAME="affected test",
        GIT_AUTHOR_EMAIL="affected@test.invalid",
        GIT_COMMITTER_NAME="affected test",
        GIT_COMMITTER_EMAIL="affected@test.invalid",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
    )
    env.setdefault("QNN_PANTS_CACHE", str(home_cache))
    return env


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repo]:
    tmp = tmp_path_factory.mktemp("affected")
    root = tmp / "repo"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "pants.toml").write_text(synthetic_pants_toml())
    (root / "build-support").mkdir()
    for name in ("pants", "build-support/pants-requirements.txt", "build-support/affected",
                 "build-support/affected.py"):
        shutil.copyfile(ROOT / name, root / name)
    for exe in ("pants", "build-support/affected"):
        (root / exe).chmod(0o755)

    home = Path(os.environ.get("HOME", tmp))
    cache = Path(os.environ.get("QNN_PANTS_CACHE", home / ".cache" / "qnn-pants"))
    # The launcher builds the pex tool (from PyPI, ~10 s) into each buildroot; keep one built copy
    # beside its Pants venvs. The launcher checks its sha256 against pants.toml before using it.
    kept_pex = cache / "affected-test" / PEX_NAME
    bootstrap_pex = root / "build-support" / ".bootstrap" / PEX_NAME
    if kept_pex.is_file():
        bootstrap_pex.parent.mkdir(parents=True)
        shutil.copy2(kept_pex, bootstrap_pex)

    repo = Repo(root, pants_env(cache, tmp))
    repo.git("init", "--quiet", "--initial-branch=main")
    repo.git("add", "--all")
    repo.git("commit", "--quiet", "-m", "base")
    repo.git("branch", "base")
    yield repo
    if not kept_pex.is_file() and bootstrap_pex.is_file():
        kept_pex.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(bootstrap_pex, kept_pex)


def affected_tests(result: dict[str, Any]) -> set[str]:
    return {a for addresses in result["tests"]["affected"].values() for a in addresses}


def jobs(result: dict[str, Any]) -> dict[str, str]:
    return {j["name"]: j["tag_args"] for j in result["jobs"]}


def test_change_in_qnn_common_selects_every_stages_tests(repo: Repo) -> None:
    repo.commit_change("src/python/qnn_common/contracts.py", "\n# a contract changed\n")
    result = repo.affected()
    # The denominator first: every test file of the synthetic repo is one test target.
    assert result["tests"]["total"] == len(ALL_TESTS) == 9
    assert result["tests"]["total_by_category"] == {"unit": 4, "op": 2, "feature": 2, "e2e": 1}
    assert result["packages"]["all"] == ALL_PACKAGES
    assert result["uncategorized"] == []
    assert not result["run_all"], "selected by the graph, not by the catch-all rule"
    assert affected_tests(result) == ALL_TESTS
    assert result["tests"]["affected_count"] == 9
    assert result["packages"]["affected"] == ALL_PACKAGES
    assert jobs(result) == {
        "unit": "--tag=unit",
        "op backend-portable": "--tag=op --tag=backend-portable",
        "op backend-xnnpack": "--tag=op --tag=backend-xnnpack",
        "feature": "--tag=feature",
        "e2e": "--tag=e2e",
    }


def test_change_in_qnn_quant_selects_its_dependents_only(repo: Repo) -> None:
    repo.commit_change("src/python/qnn_quant/api.py", "\n# a quantizer changed\n")
    result = repo.affected()
    assert result["tests"]["affected"] == {
        "unit": [UNIT["qnn_pipeline"], UNIT["qnn_quant"]],
        "op": [OP_XNNPACK],
        "feature": [FEATURE_QUANT],
        "e2e": [E2E],
    }
    assert UNIT["qnn_infer"] not in affected_tests(result)
    assert result["tests"]["affected_count"] == 5
    assert result["packages"]["affected"] == ["qnn_pipeline", "qnn_quant"]
    assert set(jobs(result)) == {"unit", "op backend-xnnpack", "feature", "e2e"}
    assert result["pants_specs"] == ["--changed-since=HEAD~1", "--changed-dependents=transitive"]


def test_readme_only_change_selects_no_tests(repo: Repo) -> None:
    repo.commit_change("README.md", "\nMore words.\n")
    result = repo.affected()
    assert result["changed_files"] == ["README.md"]
    assert result["outside_graph"] == ["README.md"]
    assert result["tests"]["affected_count"] == 0
    assert result["packages"]["affected"] == []
    assert result["jobs"] == []


def test_build_config_change_selects_everything(repo: Repo) -> None:
    # Pants maps pants.toml to no target, yet it changes how every target is built and tested.
    repo.commit_change("pants.toml", "\n# a setting changed\n")
    result = repo.affected()
    assert result["run_all"]
    assert result["global_changes"] == ["pants.toml"]
    assert affected_tests(result) == ALL_TESTS
    assert result["pants_specs"] == ["::"]

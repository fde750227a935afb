"""A real REAPI server on loopback for tests: BuildGrid from PyPI, in a venv of its own.

BuildGrid 0.9.1 needs CPython >= 3.13 (the project runs on 3.11), so it gets its own venv, built
once from the pinned `buildgrid-requirements.txt` and kept beside the Pants launcher's venvs
(`$QNN_PANTS_CACHE`, default ~/.cache/qnn-pants), keyed by that file's digest. The server runs
CAS, ActionCache and ByteStream for one instance, on disk in a temp dir, and demands a JWT (HS256)
bearer token on every call: the same `authorization` header a shared cache in CI would demand.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "buildgrid-requirements.txt"
INSTANCE = "qnn-ci"

# thread-pool-size / maximum-concurrent-rpcs: BuildGrid's default is 5 threads per core (10
# here), and it answers RPCs past that with ResourceExhausted "Concurrent RPC limit exceeded!";
# Pants sends up to 128 at once (remote_store_rpc_concurrency), and each refused read is a cache
# miss: a second clean clone then rebuilt 6-8 of its 36 processes, the largest among them.
CONFIG = """\
thread-pool-size: 64
maximum-concurrent-rpcs: 256
server:
  - !channel
    address: "127.0.0.1:{port}"
    insecure-mode: true
authorization:
  method: jwt
  secret: {secret}
  algorithm: hs256
storages:
  - !disk-storage &cas
    path: {cas}
caches:
  - !lru-action-cache &ac
    storage: *cas
    max-cached-refs: 100000
    allow-updates: true
    cache-failed-actions: false
instances:
  - name: {instance}
    services:
      - !action-cache
        cache: *ac
      - !cas
        storage: *cas
      - !bytestream
        storage: *cas
"""

# Capabilities without and with the token: the server must refuse the first.
PROBE = """\
import sys, grpc
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as pb
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2_grpc as rpc
stub = rpc.CapabilitiesStub(grpc.insecure_channel(sys.argv[1]))
req = pb.GetCapabilitiesRequest(instance_name=sys.argv[2])
try:
    stub.GetCapabilities(req, timeout=10)
    print("anonymous: OK")
except grpc.RpcError as err:
    print("anonymous:", err.code().name)
caps = stub.GetCapabilities(req, timeout=10, metadata=[("authorization", "Bearer " + sys.argv[3])])
print("with token: OK", caps.cache_capabilities.action_cache_update_capabilities.update_enabled)
"""


def find_python313() -> str:
    """A CPython >= 3.13 for BuildGrid: one of pyenv's (part of the machine image), or on PATH.

    Each candidate is run: a pyenv shim on PATH exists even where that version is not selected.
    """
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(f"{pyenv}/versions/3.1[3-9]*/bin/python3"), reverse=True)
    candidates += sorted(glob.glob("/root/.pyenv/versions/3.1[3-9]*/bin/python3"), reverse=True)
    candidates += [shutil.which(f"python3.{minor}") or "" for minor in (13, 14)]
    for cand in candidates:
        if cand and os.access(cand, os.X_OK) and subprocess.run(
            [cand, "-c", "import sys; sys.exit(sys.version_info < (3, 13))"],
            capture_output=True, check=False,
        ).returncode == 0:
            return cand
    raise RuntimeError(
        "BuildGrid 0.9.1 needs CPython >= 3.13 and none was found (pyenv, PATH): install one "
        "('pyenv install 3.13' or 'apt-get install python3.13')"
    )


def buildgrid_venv(cache: Path, env: dict[str, str]) -> Path:
    """The venv with BuildGrid, built once per requirements digest; returns its `bin/`."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]
    venv = cache / f"buildgrid-{digest}"
    if not (venv / ".complete").is_file():
        shutil.rmtree(venv, ignore_errors=True)  # a half-finished earlier build
        start = time.monotonic()
        subprocess.run([find_python313(), "-m", "venv", str(venv)], check=True, env=env)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
             "--no-deps", "-r", str(REQUIREMENTS)],
            check=True, env=env, timeout=600,
        )
        (venv / ".complete").touch()
        print(f"BuildGrid venv built in {time.monotonic() - start:.1f} s: {venv}")
    return venv / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Server:
    address: str  # grpc://127.0.0.1:PORT
    instance: str
    token: str
    startup_seconds: float
    probe: str  # what the unauthenticated / authenticated Capabilities calls got


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"BuildGrid exited with {proc.returncode}:\n{log.read_text()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"BuildGrid did not listen on {port} in {timeout} s:\n{log.read_text()}")


@contextmanager
def buildgrid(cache: Path, workdir: Path, env: dict[str, str]) -> Iterator[Server]:
    """Start BuildGrid on 127.0.0.1 (a free port) and stop it on exit, whatever happened."""
    bin_dir = buildgrid_venv(cache, env)
    workdir.mkdir(parents=True, exist_ok=True)
    secret = workdir / "jwt.secret"
    secret.write_text(hashlib.sha256(os.urandom(32)).hexdigest())
    token = subprocess.run(
        [str(bin_dir / "python"), "-c",
         "import jwt, sys, time; print(jwt.encode({'sub': 'qnn-ci', 'exp': int(time.time()) + "
         "3600}, open(sys.argv[1]).read(), algorithm='HS256'))", str(secret)],
        check=True, capture_output=True, text=True, env=env,
    ).stdout.strip()
    port = free_port()
    config = workdir / "buildgrid.yml"
    config.write_text(CONFIG.format(port=port, secret=secret, cas=workdir / "cas",
                                    instance=INSTANCE))
    (workdir / "cas").mkdir(exist_ok=True)
    log = workdir / "buildgrid.log"
    start = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen([str(bin_dir / "bgd"), "server", "start", str(config)],
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        _wait_listening(port, proc, log, timeout=60)
        startup = time.monotonic() - start
        probe = subprocess.run(
            [str(bin_dir / "python"), "-c", PROBE, f"127.0.0.1:{port}", INSTANCE, token],
            check=True, capture_output=True, text=True, env=env, timeout=60,
        ).stdout
        yield Server(f"grpc://127.0.0.1:{port}", INSTANCE, token, startup, probe)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)

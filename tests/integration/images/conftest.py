"""Session fixtures for image tests: a Docker engine, a test project, the base, each image built once.

Everything created here (images, containers, the bootstrapped base when this
session made it) carries the label io.gpurig.test=<session id> and is removed
at the end; BuildKit's cache stays, trimmed to GPURIG_TEST_KEEP_BUILD_CACHE
(25GB) so that repeated sessions do not fill the disk.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpurig.errors import DockerError

REPO = Path(__file__).resolve().parents[3]
TEST_LABEL = "io.gpurig.test"
SESSION = uuid.uuid4().hex[:12]
# Per session, so that two sessions on one engine never move each other's tags.
SPEC_NAME = f"gpurig-test-{SESSION[:8]}"
# The base too: other sessions on the same engine bootstrap, retag and remove `debian:bookworm-slim` as they
# come and go, which would pull the base from under this session's builds (and their cache hits).
BASE = f"gpurig-test-base-{SESSION[:8]}:bookworm"
CPU_TORCH = "2.13.0"
CUDA_TORCH, CUDA = "2.14.1", "13.0"



def pytest_configure(config):
    config.addinivalue_line("markers", "slow: builds a CUDA image (torch with its CUDA wheels, about 3 GB)")


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/integration/images" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def wheel_dir() -> str | None:
    """The host pip's find-links directory, if it holds the CPU torch wheel (PIP_FIND_LINKS or pip config)."""
    candidates = os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
        for line in out.stdout.splitlines():
            key, _, value = line.partition("=")
            if key.endswith("find-links"):
                candidates += value.strip().strip("'\"").split()
    except (OSError, subprocess.TimeoutExpired):
        pass
    for folder in candidates:
        if Path(folder).is_dir() and list(Path(folder).glob(f"torch-{CPU_TORCH}+cpu-*.whl")):
            return folder
    return None


SPEC = """\
name: {name}
python: "3.11"
registry: "{registry}"
matrix:
  - {{torch: "{cpu_torch}", cuda: "cpu", default: true}}
  - {{torch: "{cuda_torch}", cuda: "{cuda}"}}
base:
  image: {base}
{bootstrap}
variants:
  slim: {{{slim}}}
  ssh: {{}}
  jupyter: {{}}
  full: {{}}
build:
  find_links: [{wheels}]
  torch_index: ""
  ca_bundle: auto
  aliases: ["{{variant}}-{{cuda_tag}}"]
"""


def write_spec(path: Path, wheels: str, registry: str = "", base: str = BASE,
               bootstrap: bool = True, slim: str = "") -> Path:
    boot = '  bootstrap: {suite: bookworm, mirror: "http://deb.debian.org/debian"}' if bootstrap else ""
    path.write_text(SPEC.format(name=SPEC_NAME, registry=registry, cpu_torch=CPU_TORCH, cuda_torch=CUDA_TORCH,
                                cuda=CUDA, base=base, bootstrap=boot, slim=slim, wheels=wheels))
    return path


@dataclass(frozen=True)
class Cli:
    """`gpurig ...` run as a user would, in the test project."""

    project: Path
    env: dict

    def __call__(self, *args: str, env: dict | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
        code = "import sys; from gpurig.cli import main; main(['gpurig', *sys.argv[1:]])"
        return subprocess.run(
            [sys.executable, "-c", code, *args], cwd=self.project, env=env or self.env,
            capture_output=True, text=True, timeout=timeout,
        )


def docker(*args: str, check: bool = True, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])} failed: {proc.stderr.strip()[-500:]}")
    return proc


DOCKER = "docker"


@pytest.fixture(scope="session")
def docker_client(systemd_images):
    # systemd_images (lazy: nothing is built until asked) is set up first so that it is torn down last: the base it
    # made goes only after the images this session built on it.
    from gpurig.image.dockercli import find_client

    global DOCKER
    try:
        client = find_client()
    except DockerError as err:
        pytest.skip(f"no usable Docker engine: {err}")
    DOCKER = client.path
    yield client
    # Everything this session labelled goes; BuildKit's cache stays.
    ids = docker("ps", "-aq", "--filter", f"label={TEST_LABEL}={SESSION}").stdout.split()
    if ids:
        docker("rm", "-f", "-v", *ids, check=False)
    for _ in range(3):  # a base goes only once the images built on it are gone
        ids = docker("image", "ls", "-q", "--filter", f"label={TEST_LABEL}={SESSION}").stdout.split()
        if not ids:
            break
        docker("image", "rm", "-f", *sorted(set(ids)), check=False)
    docker("volume", "prune", "-f", "--filter", f"label={TEST_LABEL}={SESSION}", check=False)
    docker("image", "rm", BASE, check=False)  # the session's name for the kept base (systemd_kit.kept_base), which stays
    # The base is kept from run to run, so the next run's builds hit the cache built on it; bound the cache all the same
    # (least recently used goes first; about 18 GB is this suite's own, CUDA images included).
    docker("builder", "prune", "-f", "--keep-storage", os.environ.get("GPURIG_TEST_KEEP_BUILD_CACHE", "25GB"), check=False)


@pytest.fixture(scope="session")
def engine(docker_client):
    """This machine's engine (the one the build uses around `docker build`), for what the tests read of its store."""
    from gpurig.connect.engineopen import local_engine

    with local_engine() as opened:
        yield opened


@pytest.fixture(scope="session")
def wheels() -> str:
    found = wheel_dir()
    if not found:
        pytest.skip(f"no torch-{CPU_TORCH}+cpu wheel in pip's find-links (PIP_FIND_LINKS / pip config list)")
    return found


@pytest.fixture(scope="session")
def project(tmp_path_factory, wheels) -> Path:
    """A project directory using this checkout's templates and checks, with a CPU/CUDA test spec."""
    root = tmp_path_factory.mktemp("project")
    for name in ("templates", "checks", ".hadolint.yaml"):
        (root / name).symlink_to(REPO / name)
    (root / "images").mkdir()
    write_spec(root / "images" / "pytorch.yaml", wheels)
    return root


@pytest.fixture(scope="session")
def cli(project) -> Cli:
    return Cli(project, dict(os.environ))


@pytest.fixture(scope="session")
def base(docker_client, engine, project, systemd_images):
    """The Debian base, once per session: the systemd hosts' debootstrapped Debian 12 base, named BASE, which
    ensure_base then finds in the local store (else it pulls, else bootstraps).

    One base for the whole suite: the CPU images built here and the deploy tests' (tests/integration/deploy/
    cpuimages.py, the same spec on that base) share BuildKit's cache, so whichever builds second takes every
    layer from it instead of installing torch again. The base is kept for the next run (systemd_kit.kept_base);
    BASE, this session's name for it, goes at the end.
    """
    from gpurig.image.baseimage import ensure_base
    from gpurig.image.spec import load_spec

    docker("tag", systemd_images.base("debian12"), BASE)
    spec = load_spec(project / "images" / "pytorch.yaml")
    said: list[str] = []
    found = ensure_base(engine, spec.base, spec.bootstrap, {TEST_LABEL: SESSION}, say=said.append)
    return found, said


@dataclass(frozen=True)
class Built:
    ref: str
    report: dict
    output: str


@pytest.fixture(scope="session")
def build(cli, base) -> Callable[..., Built]:
    """build(variant, cuda='cpu'): the image built once per session through `gpurig build`."""
    done: dict[tuple[str, str], Built] = {}

    def build_once(variant: str, cuda: str = "cpu") -> Built:
        key = (variant, cuda)
        if key not in done:
            proc = cli("build", "--variant", variant, "--cuda", cuda, "--label", f"{TEST_LABEL}={SESSION}")
            assert proc.returncode == 0, f"gpurig build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
            torch = CPU_TORCH if cuda == "cpu" else CUDA_TORCH
            tag = f"{torch}-{'cpu' if cuda == 'cpu' else 'cu' + cuda.replace('.', '')}-{variant}"
            report = json.loads((cli.project / "reports" / "builds" / SPEC_NAME / f"{tag}.json").read_text())
            done[key] = Built(f"{SPEC_NAME}:{tag}", report, proc.stdout)
        return done[key]

    return build_once


@pytest.fixture(scope="session")
def containers(docker_client):
    """start(image, *args, ...) -> container id; all of them are removed at the end of the session."""
    started: list[str] = []

    def start(image: str, *args: str, env: dict | None = None, ports: tuple[int, ...] = (), entrypoint: str = "") -> str:
        argv = ["run", "-d", "--label", f"{TEST_LABEL}={SESSION}"]
        for key, value in (env or {}).items():
            argv += ["-e", f"{key}={value}"]
        for port in ports:
            argv += ["-p", f"127.0.0.1::{port}"]
        if entrypoint:
            argv += ["--entrypoint", entrypoint]
        cid = docker(*argv, image, *args).stdout.strip()
        started.append(cid)
        return cid

    yield start
    if started:
        docker("rm", "-f", "-v", *started, check=False)


def host_port(cid: str, port: int) -> int:
    out = docker("port", cid, str(port)).stdout.strip().splitlines()[0]
    return int(out.rsplit(":", 1)[1])


def wait_for(what: str, probe: Callable[[], object], deadline_s: float = 120, every_s: float = 0.5):
    """Poll ``probe`` until it returns something truthy; fail with ``what`` at the deadline."""
    end = time.monotonic() + deadline_s
    last: object = None
    while time.monotonic() < end:
        try:
            last = probe()
            if last:
                return last
        except Exception as err:  # noqa: BLE001 - the probe's failure is the state we wait out
            last = err
        time.sleep(every_s)
    raise AssertionError(f"{what}: not reached within {deadline_s:.0f} s (last: {last!r})")


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def run_in(image: str, *args: str, user: str | None = None, entrypoint: str | None = None,
           timeout: float = 600) -> subprocess.CompletedProcess:
    """docker run --rm (labelled, no network) of one command in an image."""
    argv = ["run", "--rm", "--network", "none", "--label", f"{TEST_LABEL}={SESSION}"]
    if user:
        argv += ["--user", user]
    if entrypoint:
        argv += ["--entrypoint", entrypoint]
    return docker(*argv, image, *args, check=False, timeout=timeout)


def probe_records(stdout: str) -> dict[str, dict]:
    """The records of checks/verify_torch.py --json, by id."""
    return {r["id"]: r for r in json.loads(stdout)["records"]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    """Debian's docker-registry on 127.0.0.1 with a test-owned config (no auth), storage in a temp dir."""
    binary = shutil.which("docker-registry") or shutil.which("registry")
    if not binary:
        pytest.skip("docker-registry is not installed (apt-get install docker-registry)")
    root = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}', secret: '{uuid.uuid4().hex}'}}\n"
    )
    log = open(root / "registry.log", "w")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for("registry answering", lambda: proc.poll() is None and port_open(port), 30, 0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()

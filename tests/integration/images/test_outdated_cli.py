"""`gpurig outdated` as a user runs it: a project from `gpurig init`, a package index served from a folder, recorded facts, a real registry.

The index is a plain folder served over HTTP in PEP 503's layout
(``<cuda_tag>/torch/<wheel>``), as a mirror of download.pytorch.org
would be; pip reads only the wheels' names, so the files are empty.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpurig.deploy.registry import LocalRegistry
from gpurig.facts import parse_facts

REPO = Path(__file__).resolve().parents[3]
FACTS = REPO / "tests" / "fixtures" / "facts"
WHEEL = "torch-{version}-cp311-cp311-manylinux_2_28_x86_64.whl"
# What the project made by `gpurig init` installs: its matrix's own builds (2.14.1 cu130 comes from PyPI).
MATRIX_BUILDS = {"cu128": ["2.9.1+cu128"], "cpu": ["2.13.0+cpu"], "pypi": ["2.14.1"]}


def gpurig(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    code = "import sys; from gpurig.cli import main; main(['gpurig', *sys.argv[1:]])"
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def index(tmp_path):
    """serve(builds) -> the index's URL, with an empty wheel file per version under each flavour's folder."""
    root = tmp_path / "index"
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def serve(builds: dict[str, list[str]]) -> str:
        for flavour, versions in builds.items():
            folder = root / flavour / "torch"
            folder.mkdir(parents=True, exist_ok=True)
            for version in versions:
                (folder / WHEEL.format(version=version)).touch()
        return f"http://127.0.0.1:{server.server_port}"

    yield serve
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def project(tmp_path: Path, index_url: str, base: str = "gpurig-outdated-test:absent") -> Path:
    made = gpurig(tmp_path, "init", "proj")
    assert made.returncode == 0, made.stderr
    spec = tmp_path / "proj" / "images" / "pytorch.yaml"
    text = spec.read_text().replace("image: debian:bookworm-slim", f"image: {base}")
    text = text.replace("build:\n", f"build:\n  torch_index: {index_url}/{{cuda_tag}}\n  pip_index: {index_url}/pypi\n")
    spec.write_text(text)
    return tmp_path / "proj"


def facts_report(path: Path, drivers: dict[str, str]) -> Path:
    """A `gpurig facts --json` report of A100 hosts recorded on a real one, each given the driver named."""
    recorded = parse_facts((FACTS / "a100-driver550-open-docker-stopped.txt").read_text()).to_dict()
    hosts = [{"host": host, "status": "ok", "data": recorded | {"driver_version": driver}} for host, driver in drivers.items()]
    path.write_text(json.dumps({"schema": "gpurig.facts/1", "hosts": hosts}))
    return path


def test_a_newer_torch_names_its_cuda_builds_the_driver_each_needs_and_the_hosts_below_it(tmp_path, index):
    url = index({**MATRIX_BUILDS, "cu130": ["2.15.0+cu130", "2.14.1+cu130"], "cu126": ["2.15.0+cu126"], "cpu": ["2.13.0+cpu", "2.15.0+cpu"]})
    facts = facts_report(tmp_path / "facts.json", {"a100-01": "550.54.15", "a100-02": "535.161.08", "a100-03": "580.82.07"})
    result = gpurig(project(tmp_path, url), "outdated", "--facts", str(facts), "--json", "-")
    assert result.returncode == 1, result.stderr  # something is newer: CI's signal to rebuild
    doc = json.loads(result.stdout)
    rows = {(r["entry"], r["newer"]): r for r in doc["torch"]}
    assert rows[("2.9.1 cu128", "2.15.0 cu130")]["fleet"] == "2 of 3 hosts older: a100-[01:02]"
    assert rows[("2.9.1 cu128", "2.15.0 cu130")]["needs"] == "driver >= 580.65.06"
    assert ("2.9.1 cu128", "2.15.0 cu126") not in rows  # an older CUDA than the image's is no upgrade
    assert rows[("2.13.0 cpu", "2.15.0 cpu")]["needs"] == "no driver"
    assert doc["problems"] == [] and doc["bases"][0]["state"] == "absent"

    table = gpurig(tmp_path / "proj", "outdated", "--facts", str(facts))
    assert "2.15.0 cu130" in table.stdout and "a100-[01:02]" in table.stdout and table.returncode == 1


def test_a_matrix_the_index_has_nothing_newer_for_is_current_and_exits_0(tmp_path, index):
    proj = project(tmp_path, index(MATRIX_BUILDS))
    spec = proj / "images" / "pytorch.yaml"  # 2.14.1 is newer than 2.9.1: only the newest entries stay
    spec.write_text(spec.read_text().replace('  - {torch: "2.9.1", cuda: "12.8"}\n', ""))
    result = gpurig(proj, "outdated", "--no-fleet", "--json", "-")
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["current"] is True and {r["newer"] for r in doc["torch"]} == {""}


def test_an_index_that_does_not_answer_is_never_current(tmp_path, index):
    index({})  # the server runs; the spec points at a port nothing listens on
    with socket_closed() as port:
        proj = project(tmp_path, f"http://127.0.0.1:{port}")
        result = gpurig(proj, "outdated", "--no-fleet")
        doc = json.loads(gpurig(proj, "outdated", "--no-fleet", "--json", "-").stdout)
    assert result.returncode == 2
    assert "pip could not read http://127.0.0.1:" in result.stderr and "Connection refused" in result.stderr
    assert not re.search(r"(cu\d+|cpu) +current", result.stdout), result.stdout  # no row it could not read says current
    assert re.search(r"cpu +unknown +pip could not read", result.stdout), result.stdout
    assert doc["current"] is False and all(r["unknown"] and not r["newer"] for r in doc["torch"])


def socket_closed():
    import contextlib
    import socket

    @contextlib.contextmanager
    def closed():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        yield port

    return closed()


def test_a_base_whose_tag_moved_on_its_registry_is_newer(tmp_path, index, docker_engine):
    def image(name: str, content: str) -> None:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "release").write_text(content)
        with tarfile.open(tmp_path / f"{name}.tar", "w") as tar:
            tar.add(folder / "release", arcname="release")
        docker_engine("import", str(tmp_path / f"{name}.tar"), ref)

    made: list[str] = []  # both images by id: the new one loses its name when the old one takes it back
    with LocalRegistry(tmp_path / "registry") as registry:
        ref = f"{registry.address}/outdated-base:bookworm"
        try:
            image("old", "12.1")
            docker_engine("push", ref)
            old_id = docker_engine("image", "inspect", "-f", "{{.Id}}", ref).stdout.strip()
            made.append(old_id)
            proj = project(tmp_path, index(MATRIX_BUILDS), base=ref)
            current = gpurig(proj, "outdated", "--no-fleet", "--json", "-")
            assert json.loads(current.stdout)["bases"][0]["state"] == "current", current.stderr
            image("new", "12.2")  # the registry's tag moves on; this machine keeps the old image under it
            made.append(docker_engine("image", "inspect", "-f", "{{.Id}}", ref).stdout.strip())
            docker_engine("push", ref)
            docker_engine("tag", old_id, ref)
            moved = gpurig(proj, "outdated", "--no-fleet", "--json", "-")
        finally:
            docker_engine("rmi", "-f", ref, *made, check=False)
    base = json.loads(moved.stdout)["bases"][0]
    assert moved.returncode == 1 and base["state"] == "newer" and f"docker pull {ref}" in base["detail"]

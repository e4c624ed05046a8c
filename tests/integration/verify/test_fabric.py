"""`gpurig verify --level fabric` over three SSH hosts, with a real gloo all-reduce in the CPU torch image built by gpurig.

The three hosts are sshd containers whose `docker` is this machine's engine
(tests/integration/verify/conftest.py's ``sshd_docker_host``): the 1 GB torch
image is built once and present on all three without a copy, and each rank
is a container of it started through that host's SSH connection and engine,
with host networking. So the ranks share this machine's network stack: the
all-reduce, its rendezvous and the records are real (TCP through eth0), a
link slower on one host is not something this fleet can have. The fault
injected is a host whose ``gpurig_fabric.interface`` does not exist: its
rank fails and the fabric's record names it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from contextlib import ExitStack

import pytest
import yaml
from systemd_kit import interrupt_when

from tests.integration.verify.conftest import REPO, gpurig, sshd_docker_host

pytestmark = pytest.mark.integration
SIZES = 9  # fabric_allreduce.py's default: 4 kB .. 256 MB, x4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def fabric_hosts(docker_engine, container_kit, host_image, host_key, tmp_path_factory):
    """Three hosts' (name, inventory vars), removed at the end of the module."""
    folder = tmp_path_factory.mktemp("fabric-hosts")
    with ExitStack() as stack:
        yield [stack.enter_context(sshd_docker_host(docker_engine, container_kit, host_image, host_key, folder)) [::2]
               for _ in range(3)]


def inventory(tmp_path, hosts, per_host: dict[str, dict] | None = None, timeout: int = 15):
    """Every host on eth0 (this VM's hostname resolves to 127.0.0.1: gloo's own choice would be lo), a free port, ``timeout``."""
    port = free_port()
    data = {name: {**hostvars, "gpurig_fabric": {"interface": "eth0", "port": port, "timeout": timeout, **(per_host or {}).get(name, {})}}
            for name, hostvars in hosts}
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"all": {"children": {"fabric": {"hosts": data}}}}, sort_keys=False))
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    if not (project / "checks").exists():
        (project / "checks").symlink_to(REPO / "checks")
    return path, project


def fabric_records(doc: dict) -> dict[str, dict]:
    [entry] = doc["hosts"]
    return {r["id"]: r for r in entry["data"]["records"]}


def leftovers(docker_engine) -> list[str]:
    return docker_engine("ps", "-aq", "--filter", "label=io.gpurig.fabric").stdout.split()


def test_three_hosts_all_reduce_together_with_busbw_per_size(fabric_hosts, torch_image, tmp_path, docker_engine):
    path, project = inventory(tmp_path, fabric_hosts)
    report, junit = tmp_path / "fabric.json", tmp_path / "fabric.xml"
    proc = gpurig("verify", "-i", str(path), "-l", "fabric", "--level", "fabric", "--image", torch_image,
                  "--json", str(report), "--junit", str(junit), cwd=project)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(report.read_text())
    assert doc["schema"] == "gpurig.verify/1" and doc["level"] == "fabric" and doc["passed"] is True
    assert doc["hosts"][0]["host"] == "fabric (3 hosts)" and doc["excluded"] == {}
    assert doc["ranked"] == [name for name, _ in fabric_hosts]
    assert doc["master"] and not doc["master"].startswith("127.")  # rank 0's eth0 address, not loopback
    got = fabric_records(doc)
    sized = [r for rid, r in got.items() if rid.startswith("fabric.allreduce.") and rid != "fabric.allreduce.correct"]
    assert len(sized) == SIZES and all(r["measured"] > 0 and r["unit"] == "GB/s" for r in sized), sized
    assert got["fabric.latency"]["measured"] > 0
    assert got["fabric.interface"]["status"] == "pass" and got["fabric.rendezvous"]["status"] == "pass"
    assert got["fabric.busbw"]["status"] in ("pass", "skip")  # eth0 of a VM reports no speed: no promise, no verdict
    assert "fabric.checked" not in got and not any(r["status"] == "fail" for r in got.values())
    row = next(line for line in proc.stdout.splitlines() if line.startswith("fabric"))
    assert " pass " in row and "busbw" in row
    assert 'name="fabric (3 hosts)"' in junit.read_text()
    kept = [json.loads(line) for line in (project / ".gpurig" / "history" / "verify.jsonl").read_text().splitlines()]
    assert [(e["host"], e["hosts"], e["level"], e["passed"]) for e in kept] == [("*fabric*", doc["ranked"], "fabric", True)]
    assert not leftovers(docker_engine)


def test_a_host_with_a_missing_interface_is_named_by_its_failing_record(fabric_hosts, torch_image, tmp_path, docker_engine):
    bad = fabric_hosts[2][0]
    path, project = inventory(tmp_path, fabric_hosts, {bad: {"interface": "nosuch0"}}, timeout=5)
    report = tmp_path / "fabric.json"
    proc = gpurig("verify", "-i", str(path), "-l", "fabric", "--level", "fabric", "--image", torch_image, "--json", str(report), cwd=project)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(report.read_text())
    assert doc["passed"] is False
    got = fabric_records(doc)
    failing = [r for r in got.values() if r["status"] == "fail"]
    # its own record, from its facts: the interface it was told to use is not there
    assert got["fabric.interface"]["status"] == "fail", failing
    assert got["fabric.interface"]["detail"] == f"{bad}: {bad} has no usable interface by gpurig_fabric.interface nosuch0 (up, with an address)"
    # its facts already showed it: no rank was started (the others would have waited out their timeout), and the run says why
    assert got["fabric.checked"]["detail"] == ("nothing was measured: the ranks were not started, as "
                                               f"{bad} has no usable interface by gpurig_fabric.interface nosuch0 (up, with an address)")
    assert "the all-reduce was not started" in proc.stderr
    assert all(r["fix"] for r in failing)
    assert not leftovers(docker_engine)


def test_ctrl_c_while_the_ranks_wait_removes_every_rank_container_and_says_so(fabric_hosts, torch_image, tmp_path, docker_engine):
    # rank 0's address answers nothing (TEST-NET-1, on eth0's own subnet): every rank waits at the rendezvous for its timeout
    first = fabric_hosts[0][0]
    path, project = inventory(tmp_path, fabric_hosts, {first: {"address": "192.0.2.254", "timeout": 120}})
    code = "import sys; from gpurig.cli import main; main(['gpurig', *sys.argv[1:]])"
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-c", code, "verify", "-i", str(path), "-l", "fabric", "--level", "fabric",
                             "--image", torch_image], cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def ranks_running() -> bool:
        return len(docker_engine("ps", "-q", "--filter", "label=io.gpurig.fabric", "--filter", "name=-rank-").stdout.split()) == 3

    out, err, took = interrupt_when(proc, ranks_running, "the three ranks running", deadline_s=180)
    assert proc.returncode == 130, out + err
    assert "gpurig: interrupted; removed 3 fabric containers (io.gpurig.fabric=" in err, err
    assert not leftovers(docker_engine)
    assert took < 60, f"Ctrl-C took {took:.0f}s to end the run"


def test_an_image_not_on_the_hosts_is_one_line_per_host_naming_gpurig_deploy(fabric_hosts, tmp_path, docker_engine):
    path, project = inventory(tmp_path, fabric_hosts)
    report = tmp_path / "fabric.json"
    missing = "gpurig-fabric-absent:never-built"
    proc = gpurig("verify", "-i", str(path), "-l", "fabric", "--level", "fabric", "--image", missing, "--json", str(report), cwd=project)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "is left out of the fabric run" in line]
    assert len(lines) == 3 and all(f"image {missing} is not on this host" in line and "gpurig deploy" in line for line in lines), lines
    assert {line.split()[0] for line in lines} == {name for name, _ in fabric_hosts}
    doc = json.loads(report.read_text())
    got = fabric_records(doc)
    assert doc["passed"] is False and set(doc["excluded"]) == {name for name, _ in fabric_hosts}
    assert got["fabric.checked"]["status"] == "fail" and "0 hosts left" in got["fabric.checked"]["detail"]
    assert not leftovers(docker_engine)

"""The fabric faults' kit, shared by tests/integration/deploy/test_fabric_faults.py and bench/bench_fabric.py.

Hosts are DeployHost-likes (tests/integration/deploy/conftest.py): systemd
containers, each its own network namespace and Docker engine. The faults are
made from this machine in a host's network namespace (``nsenter``), never
through gpurig, and every one is undone on the way out of its ``with``:

- ``token_bucket``: a tbf root qdisc on the host's eth0 (this kernel has no
  netem), so the host sends at most a rate;
- ``dropped_port``: an iptables rule dropping a TCP port arriving on eth0.
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from .gpuhost import gpurig

NAMES = ("fab-a", "fab-b", "fab-c")
PORT = 29500  # gpurig_fabric.port's default, in rank 0's own network namespace: nothing else of this machine listens there
# The slowed host's egress, well under what gloo's CPUs reach on a busy 2-core machine (~0.1 GB/s = 800 Mb/s per pair,
# seen with other test sessions running; ~0.5 GB/s alone), so its pairs stay under half the best pair's whatever the load
# (1gbit was not: under load every pair fell to ~0.1 GB/s and nobody was named). MAX_SIZE_MB: 64 MB messages, the
# smallest with a busbw verdict, keep the slowed runs to seconds each.
RATE = "250mbit"
MAX_SIZE_MB = 64
UNHELD = "192.0.2.254"  # TEST-NET-1: no host holds it, and its route (the default one) leads nowhere that answers


def netns(host, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """A command of this machine (tc, iptables, ip) in ``host``'s network namespace."""
    pid = host.host.docker("inspect", "-f", "{{.State.Pid}}", host.cid).stdout.strip()
    proc = subprocess.run(["nsenter", "-t", pid, "-n", *argv], capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} in {host.name}'s netns failed: {proc.stderr.strip()}")
    return proc


def eth0_address(host) -> str:
    return netns(host, "ip", "-4", "-o", "addr", "show", "eth0").stdout.split()[3].split("/")[0]


def deliver(image: str, hosts, docker, folder: Path) -> None:
    """``image`` into every host's engine that lacks it (by id): one `docker save`, loaded into the hosts side by side."""
    want = docker("image", "inspect", "-f", "{{.Id}}", image).stdout.strip()
    missing = [h for h in hosts if h.image_id(image) != want]
    if not missing:
        return
    tar = folder / "fabric-image.tar"
    docker("save", "-o", str(tar), image, timeout=600)
    try:
        def load(host) -> None:
            with tar.open("rb") as fh:
                subprocess.run([docker.path, "exec", "-i", host.cid, "docker", "load", "-q"], stdin=fh, check=True,
                               capture_output=True, timeout=900)

        with ThreadPoolExecutor(len(missing)) as pool:
            list(pool.map(load, missing))
    finally:
        tar.unlink(missing_ok=True)
    assert all(h.image_id(image) == want for h in hosts)


@contextmanager
def token_bucket(host, rate: str = RATE):
    """``host``'s eth0 sends at most ``rate`` (tbf as its root qdisc); the qdisc removed on the way out."""
    netns(host, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms")
    try:
        yield
    finally:
        netns(host, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)


@contextmanager
def dropped_port(host, port: int = PORT):
    """``host`` drops TCP ``port`` arriving on eth0 (a firewall on the data network); the rule removed on the way out."""
    rule = ["INPUT", "-i", "eth0", "-p", "tcp", "--dport", str(port), "-j", "DROP"]
    netns(host, "iptables", "-I", *rule)
    try:
        yield
    finally:
        netns(host, "iptables", "-D", *rule, check=False)


def faults_left(host) -> list[str]:
    """What of ours is still in ``host``'s netns: a tbf qdisc, a DROP rule on the port."""
    left = [line for line in netns(host, "tc", "qdisc", "show", "dev", "eth0").stdout.splitlines() if "tbf" in line]
    return left + [line for line in netns(host, "iptables", "-S", "INPUT").stdout.splitlines() if f"--dport {PORT}" in line]


def inventory(project: Path, hosts, per_host: dict[str, dict] | None = None, timeout: int = 20) -> Path:
    """The hosts as fab-a..c (rank order), each on eth0 with ``timeout``, in ``project``/inventory/hosts.yaml."""
    data = {}
    for name, h in zip(NAMES, hosts):
        data[name] = {"ansible_host": "127.0.0.1", "ansible_port": h.port, "ansible_user": h.user,
                      "ansible_ssh_private_key_file": str(h.key), "ansible_become": True,
                      "gpurig_fabric": {"interface": "eth0", "timeout": timeout, **(per_host or {}).get(name, {})}}
    (project / "inventory").mkdir(parents=True, exist_ok=True)
    path = project / "inventory" / "hosts.yaml"
    path.write_text(yaml.safe_dump({"all": {"children": {"fabric": {"hosts": data}}}}, sort_keys=False))
    return path


@dataclass(frozen=True)
class FabricResult:
    """One `gpurig verify --level fabric`: its exit code, records by id, JSON document, seconds, and its output's tail."""

    rc: int
    records: dict
    doc: dict
    seconds: float
    output: str

    def busbw(self) -> float | None:
        """The busbw at the largest size (GB/s), None when nothing was measured."""
        r = self.records.get("fabric.busbw")
        return r["measured"] if r and isinstance(r.get("measured"), (int, float)) else None


def verify_fabric(hosts, image: str, project: Path, per_host: dict[str, dict] | None = None, timeout: int = 20) -> FabricResult:
    """`gpurig verify --level fabric` across the hosts, as a user runs it, with the JSON report read back."""
    path = inventory(project, hosts, per_host, timeout)
    report = project / "fabric.json"
    report.unlink(missing_ok=True)
    start = time.monotonic()
    proc = gpurig(project, "verify", "-i", str(path), "-l", "fabric", "--level", "fabric", "--image", image, "--json", str(report))
    took = time.monotonic() - start
    out = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert report.exists(), out
    doc = json.loads(report.read_text())
    [entry] = doc["hosts"]
    return FabricResult(proc.returncode, {r["id"]: r for r in entry["data"]["records"]}, doc, took, out)


def show(what: str, result: FabricResult) -> str:
    """The records as lines, for a test's -s output and the bench."""
    lines = [f"{what}: exit {result.rc} in {result.seconds:.1f}s"]
    for r in result.records.values():
        lines.append(f"  {r['id']:26} {r['status']:5} {r['measured']!s:>12} {r['unit']:5} {r['detail'][:200]}")
    return "\n".join(lines)

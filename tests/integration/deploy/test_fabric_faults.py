"""`gpurig verify --level fabric` across three systemd hosts, each its own network stack and Docker engine, with faults injected.

The hosts are the session's ``fleet`` (tests/integration/deploy/conftest.py):
provisioned Debian 12 systemd containers on Docker's default bridge, each
with its own network namespace (eth0, a veth on this machine's docker0) and
its own inner Docker engine, into which the module moves the CPU slim image
(torch 2.13.0+cpu, built once per session by ``cpu_images``) once. Their
stand-in nvidia-smi is told there is no driver for the module, so every host
is a host without GPUs and the ranks run gloo (the quick verify keeps such a
host in when Docker, the image and torch work). Each rank is a container of
the image in that host's engine with host networking: the all-reduce crosses
the three hosts' own links. The faults are made from this machine in a host's
network namespace (tests/integration/deploy/fabrickit.py: ``nsenter``, never
through gpurig), and removed after each test, also when it fails:

- a token bucket (``tc qdisc ... tbf``; this kernel has no netem) of
  250 Mb/s on one host's eth0, sizes up to 64 MB: the pairwise culprit
  search names that host;
- iptables dropping the rendezvous port on rank 0's eth0: fabric.rendezvous
  names rank 0's host and its port;
- ``gpurig_fabric.address`` set to an address no host holds (TEST-NET-1):
  fabric.rendezvous says so within the short timeout.

A wrong interface is tests/integration/verify/test_fabric.py's. The
rendezvous port is the default (29500) in rank 0's own network namespace,
where nothing else of this machine listens.
"""

from __future__ import annotations

import time

import pytest

from .fabrickit import MAX_SIZE_MB, NAMES, PORT, UNHELD, deliver, dropped_port, eth0_address, faults_left, show, token_bucket, verify_fabric
from .gpuhost import DEFAULT_DRIVER

SIZES = 9  # 4 kB .. 256 MB, x4: what verify --level fabric measures


@pytest.fixture(scope="module")
def fabric_fleet(fleet, cpu_images, docker_engine, tmp_path_factory):
    """(hosts, image): the fleet with the slim image in every engine and no GPU driver; the driver back at the end."""
    image = cpu_images["slim"]
    start = time.monotonic()
    deliver(image, fleet, docker_engine, tmp_path_factory.mktemp("fabric-image"))
    print(f"\nthe slim image into the hosts' engines: {time.monotonic() - start:.1f}s")  # -s shows it (the module's own setup cost)
    try:
        for host in fleet:
            host.set_driver(None)  # nvidia-smi fails as without a driver: no GPU host, so the ranks run gloo
        yield fleet, image
    finally:
        for host in fleet:
            host.set_driver(DEFAULT_DRIVER)


@pytest.fixture
def fabric(fabric_fleet, tmp_path):
    """run(per_host=None, timeout=20) -> FabricResult of `gpurig verify --level fabric` across the fleet; after the test, no
    rank container and no fault of ours is left on any host."""
    hosts, image = fabric_fleet

    def run(per_host: dict[str, dict] | None = None, timeout: int = 20):
        result = verify_fabric(hosts, image, tmp_path / "project", per_host, timeout)
        print("\n" + show(tmp_path.name, result))  # the figures bench/README.md records (-s shows them)
        return result

    yield run
    assert not any(h.docker("ps", "-aq", "--filter", "label=io.gpurig.fabric").stdout.split() for h in hosts)
    assert not [line for h in hosts for line in faults_left(h)]


def test_three_hosts_pass_with_busbw_measured_at_every_size(fabric, fabric_fleet):
    hosts, _ = fabric_fleet
    got = fabric()
    assert got.rc == 0, got.output
    doc, records = got.doc, got.records
    assert doc["passed"] is True and doc["ranked"] == list(NAMES) and doc["excluded"] == {}
    assert doc["master"] == eth0_address(hosts[0])
    sized = [r for rid, r in records.items() if rid.startswith("fabric.allreduce.") and rid != "fabric.allreduce.correct"]
    assert len(sized) == SIZES and all(r["measured"] > 0 and r["unit"] == "GB/s" for r in sized), sized
    busbw = records["fabric.busbw"]
    assert busbw["measured"] > 0 and busbw["unit"] == "GB/s"
    # every host's veth says 10000 Mb/s (floor 0.9 GB/s): gloo's CPUs, the three hosts sharing this machine's, rarely fill it;
    # a shortfall is then a warn, and no pair is slower than the others
    assert busbw["status"] == "pass" or (busbw["status"] == "warn" and "gloo reduces on the CPU" in busbw["detail"]), busbw
    assert records.get("fabric.culprit", {"status": "pass"})["status"] == "pass", records.get("fabric.culprit")
    assert records["fabric.interface"]["status"] == "pass" and records["fabric.rendezvous"]["status"] == "pass"
    assert records["fabric.speed"]["status"] == "pass" and records["fabric.mtu"]["status"] == "pass"
    assert not any(r["status"] == "fail" for r in records.values())
    row = next(line for line in got.output.splitlines() if line.startswith("fabric (3 hosts)"))
    assert "busbw" in row and " fail " not in row, row


def test_a_rate_limited_host_is_named_by_the_pairwise_search(fabric, fabric_fleet):
    hosts, _ = fabric_fleet
    with token_bucket(hosts[1]):
        got = fabric({name: {"max_size_mb": MAX_SIZE_MB} for name in NAMES})
    assert got.rc == 1, got.output
    records = got.records
    assert records["fabric.busbw"]["status"] in ("warn", "fail"), records["fabric.busbw"]  # a warn with gloo on 10 Gb/s links
    assert records["fabric.speed"]["status"] == "pass"  # the veths all say 10000 Mb/s: only measuring finds it
    culprit = records["fabric.culprit"]
    assert culprit["status"] == "fail" and culprit["measured"] == [NAMES[1]], culprit
    assert culprit["detail"].startswith(f"{NAMES[1]} is slow with every partner") and "NIC, cable" in culprit["fix"], culprit
    assert "fabric.allreduce.64MB" in records and "fabric.allreduce.256MB" not in records  # gpurig_fabric.max_size_mb


def test_a_blocked_rendezvous_port_names_rank_0s_host_and_the_port(fabric, fabric_fleet):
    hosts, _ = fabric_fleet
    with dropped_port(hosts[0], PORT):
        got = fabric(timeout=5)
    assert got.rc == 1, got.output
    record = got.records["fabric.rendezvous"]
    assert record["status"] == "fail", record
    assert record["detail"].startswith(f"{NAMES[0]} (rank 0) holds {got.doc['master']} on eth0, but no other rank got through "
                                       f"to its port {PORT}"), record
    assert record["fix"].startswith(f"open TCP port {PORT} on {NAMES[0]} to the other hosts"), record
    assert got.records["fabric.checked"]["status"] == "fail"  # nothing measured
    assert got.seconds < 90, f"a blocked port took {got.seconds:.0f}s to say so"


def test_an_address_no_host_holds_fails_the_rendezvous_within_the_timeout(fabric, fabric_fleet):
    hosts, _ = fabric_fleet
    got = fabric({NAMES[0]: {"address": UNHELD}}, timeout=5)
    assert got.rc == 1, got.output
    assert got.doc["master"] == UNHELD
    record = got.records["fabric.rendezvous"]
    assert record["status"] == "fail", record
    assert record["detail"].startswith(f"{UNHELD} is not an address of {NAMES[0]} (rank 0, which holds {eth0_address(hosts[0])} on "
                                       "eth0"), record
    assert record["fix"].startswith(f"set gpurig_fabric.address on {NAMES[0]} to an address it holds"), record
    assert got.seconds < 90, f"an unreachable rendezvous took {got.seconds:.0f}s to say so"

"""checks/fabric_facts.py's parsers on what the kernel and iproute2 print, its replay run, and fabric_allreduce.py for real.

The /proc/net/route and `ip -o addr show` texts were captured on this test
machine (a VM: virtio eth0 with speed -1, Docker's bridges); the others are
written as the kernel prints them (sysfs files end in a newline; `ip route
get` ends with its "cache" line). The real run puts 3 gloo ranks on
127.0.0.1 and one rank before a closed port; it is skipped where torch is
not installed.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from gpurig.verify.fabric import busbw, document

CHECKS = Path(__file__).resolve().parents[3] / "checks"
HAS_TORCH = importlib.util.find_spec("torch") is not None

PROC_NET_ROUTE = (
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT                                                       \n"
    "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0                                                                               \n"
    "docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0                                                                            \n"
    "br-2871040e0234\t00001CAC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0                                                                    \n"
    "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0                                                                               \n"
)
IP_O_ADDR = (
    "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
    "1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever\n"
    "4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever preferred_lft forever\n"
    "4: eth0    inet6 fe80::fc:ff:fe00:1/64 scope link \\       valid_lft forever preferred_lft forever\n"
    "5: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\\       valid_lft forever preferred_lft forever\n"
    "7: ib0@mlx5_ib0    inet 10.10.0.3/16 brd 10.10.255.255 scope global ib0\\       valid_lft forever preferred_lft forever\n"
)
TOPO = (
    "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\tPXB\t0-55\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tPXB\t0-55\t0\t\tN/A\n"
    "NIC0\tPXB\tPXB\t X \t\t\t\t\n\n"
    "Legend:\n\n  X    = Self\n  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
)


@pytest.fixture(scope="module")
def facts():
    spec = importlib.util.spec_from_file_location("fabric_facts", CHECKS / "fabric_facts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_probes_import_nothing_of_gpurig():
    for name in ("fabric_facts.py", "fabric_allreduce.py"):
        text = (CHECKS / name).read_text()
        assert "import gpurig" not in text and "from gpurig" not in text


def test_sysfs_values_as_the_kernel_prints_them(facts):
    assert facts.parse_speed("100000\n") == 100000
    assert facts.parse_speed("-1\n") is None and facts.parse_speed(None) is None  # virtio, or EINVAL on a down link
    assert facts.parse_ib_rate("200 Gb/sec (4X HDR)\n") == 200.0 and facts.parse_ib_rate("10 Gb/sec (4X SDR)\n") == 10.0
    assert facts.parse_ib_state("4: ACTIVE\n") == "ACTIVE" and facts.parse_ib_state("2: Polling\n") == "Polling"
    modules = "nvidia_peermem 16384 0 - Live 0x0000000000000000 (POE)\nib_core 434176 8 nvidia_peermem, Live 0x0 \n"
    assert facts.peermem_loaded(modules) and not facts.peermem_loaded("ib_core 434176 8 - Live 0x0\n")
    assert facts.topo_nvlink(TOPO) and not facts.topo_nvlink(TOPO.replace("NV18", "SYS"))


def test_ip_route_get_outputs(facts):
    via = facts.parse_route_get("8.8.8.8 via 192.0.2.1 dev eth0 src 192.0.2.2 uid 0 \n    cache \n")
    assert via == {"dev": "eth0", "src": "192.0.2.2", "via": "192.0.2.1", "local": False}
    assert facts.parse_route_get("10.0.0.2 dev eth1 src 10.0.0.1 uid 1000 \n    cache \n")["dev"] == "eth1"
    assert facts.parse_route_get("local 10.0.0.1 dev lo src 10.0.0.1 uid 0 \n    cache <local> \n")["local"] is True
    assert facts.parse_route_get("RTNETLINK answers: Network is unreachable\n") is None


def test_proc_net_route_longest_prefix(facts):
    table = facts.parse_proc_route(PROC_NET_ROUTE)
    assert ("eth0", "0.0.0.0", 0, "192.0.2.1", 0) in table and ("docker0", "172.17.0.0", 16, None, 0) in table
    assert facts.route_from_table(table, "8.8.8.8")["dev"] == "eth0"
    assert facts.route_from_table(table, "192.0.2.9") == {"dev": "eth0", "src": None, "via": None, "local": False}
    assert facts.route_from_table(table, "172.17.0.5")["dev"] == "docker0"


def test_ip_o_addr(facts):
    got = facts.parse_ip_addr(IP_O_ADDR)
    assert got["eth0"] == ["192.0.2.2/24", "fe80::fc:ff:fe00:1/64"] and got["ib0"] == ["10.10.0.3/16"]


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_replayed_sysfs_gives_the_document(tmp_path):
    net, ib = tmp_path / "net", tmp_path / "infiniband"
    for name, speed, mtu, kind, index in (("eth1", "100000\n", "9000\n", "1\n", "3\n"), ("ib0", None, "4092\n", "32\n", "4\n")):
        for key, value in (("speed", speed), ("mtu", mtu), ("type", kind), ("ifindex", index), ("operstate", "up\n")):
            if value is not None:
                write(net / name / key, value)
    port = ib / "mlx5_0" / "ports" / "1"
    for key, value in (("rate", "200 Gb/sec (4X HDR)\n"), ("state", "4: ACTIVE\n"), ("phys_state", "5: LinkUp\n"),
                       ("link_layer", "InfiniBand\n")):
        write(port / key, value)
    (ib / "mlx5_0" / "device" / "net" / "ib0").mkdir(parents=True)
    write(tmp_path / "modules", "nvidia_peermem 16384 0 - Live 0x0000000000000000 (POE)\n")
    proc = subprocess.run([sys.executable, str(CHECKS / "fabric_facts.py"), "--json", "--no-topo", "--sys-net", str(net),
                           "--sys-ib", str(ib), "--proc-modules", str(tmp_path / "modules"), "--to", "127.0.0.1"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    doc = document(proc.stdout, "fabric_facts")
    eth1, ib0 = doc["interfaces"]
    assert (eth1["name"], eth1["speed_mbps"], eth1["mtu"], eth1["type"]) == ("eth1", 100000, 9000, "ether")
    assert (ib0["name"], ib0["speed_mbps"], ib0["type"]) == ("ib0", None, "infiniband")
    assert doc["infiniband"] == [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate": "200 Gb/sec (4X HDR)",
                                  "rate_gbps": 200.0, "link_layer": "InfiniBand", "netdevs": ["ib0"]}]
    assert doc["peermem"] is True and doc["routes"][0]["to"] == "127.0.0.1" and doc["topo"] is None


def test_unreadable_facts_are_unknown_and_said(tmp_path):
    proc = subprocess.run([sys.executable, str(CHECKS / "fabric_facts.py"), "--no-topo", "--sys-net", str(tmp_path / "none"),
                           "--sys-ib", str(tmp_path / "none"), "--proc-modules", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=30)
    doc = json.loads(proc.stdout)
    assert doc["interfaces"] == [] and doc["infiniband"] == [] and doc["peermem"] is None
    assert any("nvidia_peermem" in u for u in doc["unknown"]) and any("lists none" in u for u in doc["unknown"])


# ---- fabric_allreduce.py for real: gloo ranks on this machine ----


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank(r: int, world: int, port: int, timeout: float = 20) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHECKS / "fabric_allreduce.py"), "--json", "--rank", str(r), "--world", str(world),
                             "--master-addr", "127.0.0.1", "--master-port", str(port), "--sizes", "4k,64k,1M", "--iters", "3",
                             "--timeout", str(timeout), "--backend", "gloo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed here")
def test_three_gloo_ranks_measure_every_size():
    port = free_port()
    procs = [rank(r, 3, port) for r in range(3)]
    try:
        outs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:  # a rank still running after a failed assertion above must not outlive the test
            if p.poll() is None:
                p.kill()
                p.wait()
    docs = [document(out, "fabric") for out in outs]
    assert all(p.returncode == 0 for p in procs), outs
    for r, doc in enumerate(docs):
        assert doc["rank"] == r and doc["world"] == 3 and doc["backend"] == "gloo"
        assert [s["bytes"] for s in doc["sizes"]] == [4096, 65536, 1 << 20] and doc["latency_us"] > 0
        for s in doc["sizes"]:
            assert s["busbw"] == pytest.approx(busbw(s["bytes"], s["seconds"], 3), rel=1e-3)
            assert s["busbw"] == pytest.approx(s["algbw"] * 4 / 3, rel=1e-3)  # 2(n-1)/n with n = 3
        ids = {x["id"]: x["status"] for x in doc["records"]}
        assert ids == {"fabric.backend": "pass", "fabric.rendezvous": "pass", "fabric.allreduce.correct": "pass",
                       "fabric.allreduce": "pass", "fabric.latency": "pass"}


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed here")
def test_a_rank_before_a_closed_port_fails_with_the_rendezvous_record_in_time():
    proc = rank(1, 2, free_port(), timeout=2)
    try:
        out, _ = proc.communicate(timeout=30)  # torch retries once: about twice the timeout, and the watchdog at timeout + 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    doc = document(out, "fabric")
    assert proc.returncode == 1 and doc["sizes"] == []
    failed = [x for x in doc["records"] if x["status"] == "fail"]
    assert [x["id"] for x in failed] == ["fabric.rendezvous"]
    assert "127.0.0.1:" in failed[0]["detail"] and "within 2 s" in failed[0]["detail"] and "TCP port" in failed[0]["fix"]


def test_the_watchdog_ends_a_phase_without_progress_and_not_one_that_beats(monkeypatch):
    spec = importlib.util.spec_from_file_location("fabric_allreduce_watchdog", CHECKS / "fabric_allreduce.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    emitted, exits = [], []
    doc = {"records": []}
    dog = probe.Watchdog(doc, lambda d: emitted.append(len(d["records"])))
    monkeypatch.setattr(probe, "os", types.SimpleNamespace(_exit=lambda code: (exits.append(code), dog.disarm())))
    monkeypatch.setattr(dog, "POLL_S", 0.02)
    dog.arm("the all-reduce of 256 MB", 0.3, "fabric.allreduce", "the fix")
    for _ in range(10):  # beating every 0.1 s keeps a 0.3 s phase alive
        time.sleep(0.1)
        dog.beat()
    assert not exits
    time.sleep(0.6)
    dog.close()
    assert exits == [probe.EXIT_WATCHDOG] and emitted == [1]
    assert doc["records"][0]["id"] == "fabric.allreduce" and "made no progress for 0.3 s" in doc["records"][0]["detail"]

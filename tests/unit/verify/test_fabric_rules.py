"""The fabric level's verdicts (gpurig/verify/fabric.py, fabric_checks.py): nccl-tests' formulas by hand, each rule both ways.

The facts documents here are shaped as checks/fabric_facts.py prints them and
the rank documents as checks/fabric_allreduce.py does; the expected figures
are worked out by hand in each test, never from the module's own constants.
"""

from __future__ import annotations

import json

import pytest

from gpurig.verify import fabric
from gpurig.verify.fabric import FabricRun, busbw, chosen_link, default_interface, document, promise
from gpurig.verify.fabric_checks import fabric_records


def iface(name="eth1", speed=100000, mtu=9000, state="up", addrs=("10.0.0.1/24",), kind="ether", virtual=False, bridge=False):
    return {"name": name, "index": 3, "speed_mbps": speed, "mtu": mtu, "operstate": state, "type": kind,
            "virtual": virtual, "bridge": bridge, "addresses": list(addrs)}


def facts(host, *interfaces, route_dev="eth1", route_error=None, ib=(), peermem=None, env=None, hostaddr="10.0.0.1"):
    ifaces = list(interfaces) or [iface()]
    lo = iface("lo", None, 65536, "unknown", ("127.0.0.1/8",), "loopback", True)
    return {"probe": "fabric_facts", "version": 1, "host": host, "hostname_address": hostaddr, "interfaces": [lo] + ifaces,
            "routes": [{"to": "10.0.0.1", "dev": None if route_error else route_dev, "src": None, "via": None, "local": False,
                        "source": "ip route get", "error": route_error}],
            "infiniband": list(ib), "peermem": peermem, "topo": None, "nvlink": None, "env": env or {}, "unknown": []}


def rank0(busbw_gbs=11.0, nbytes=256 << 20, world=4):
    seconds = nbytes / (busbw_gbs / (2 * (world - 1) / world)) / 1e9
    return {"probe": "fabric", "version": 1, "rank": 0, "world": world, "backend": "nccl", "latency_us": 25.0,
            "sizes": [{"bytes": 4096, "iters": 20, "seconds": 2e-5, "algbw": 0.2, "busbw": 0.3},
                      {"bytes": nbytes, "iters": 3, "seconds": seconds, "algbw": round(busbw_gbs * world / (2 * (world - 1)), 4),
                       "busbw": busbw_gbs}],
            "records": [{"id": "fabric.backend", "status": "pass"}]}


HOSTS = ("a100-01", "a100-02", "a100-03", "a100-04")


def fleet(overrides=None, **kw):
    docs = {h: facts(h) for h in HOSTS}
    docs.update(overrides or {})
    return FabricRun(HOSTS, docs, {HOSTS[0]: kw.pop("rank", rank0())}, master="10.0.0.1", **kw)


def by_id(records):
    return {r.id: r for r in records}


# ---- nccl-tests' formulas ----


def test_algbw_and_busbw_follow_nccl_tests_definitions():
    # 256 MiB in 0.05 s: algbw = 268435456 / 0.05 / 1e9 = 5.36870912 GB/s; 4 ranks: busbw = algbw x 2x3/4 = 8.05306368
    assert fabric.algbw(268435456, 0.05) == pytest.approx(5.36870912)
    assert busbw(268435456, 0.05, 4) == pytest.approx(8.05306368)
    assert busbw(1 << 20, 0.001, 2) == pytest.approx(1.048576)  # two ranks: busbw = algbw
    assert fabric.gbps_of_mbps(100000) == 12.5 and fabric.gbps_of_mbps(1000) == 0.125


def test_the_probe_computes_the_same_figures():
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("fabric_allreduce", Path(__file__).resolve().parents[3] / "checks" / "fabric_allreduce.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    got = probe.size_figures(268435456, [0.06, 0.05, 0.04], 4)  # median 0.05 s
    assert got == {"bytes": 268435456, "iters": 3, "seconds": 0.05, "algbw": pytest.approx(5.36870912),
                   "busbw": pytest.approx(8.05306368)}
    assert probe.parse_sizes("4k,1M,256M") == (4096, 1 << 20, 256 << 20)
    assert probe.DEFAULT_SIZES[0] == 4096 and probe.DEFAULT_SIZES[-1] == 256 << 20 and len(probe.DEFAULT_SIZES) == 9
    assert probe.iters_for(4096, 20) == 20 and probe.iters_for(256 << 20, 20) == 3


def test_promise_is_the_typical_link_times_the_efficiency():
    expected, how = promise(fleet())
    assert expected == pytest.approx(12.5 * 0.9) and "100000 Mb/s" in how
    ib = [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate": "200 Gb/sec (4X HDR)", "rate_gbps": 200.0}]
    expected, how = promise(fleet({h: facts(h, ib=ib) for h in HOSTS}))
    assert expected == pytest.approx(25 * 0.9) and "InfiniBand 200" in how


def test_document_reads_the_last_json_line_of_its_probe():
    text = "NCCL INFO noise\n" + json.dumps(rank0()) + "\n"
    assert document(text, "fabric")["rank"] == 0
    assert document(text, "fabric_facts") is None and document("", "fabric") is None


# ---- the busbw verdict ----


def test_busbw_passes_at_the_fraction_of_the_promise():
    r = by_id(fabric_records(fleet()))["fabric.busbw"]
    assert r.status == "pass" and r.expected == ">= 9"  # 12.5 GB/s x 0.9 x 0.8


def test_busbw_below_the_promise_names_the_slow_link_and_the_fix():
    slow = {"a100-03": facts("a100-03", iface(speed=1000))}
    r = by_id(fabric_records(fleet(slow, rank=rank0(0.11))))["fabric.busbw"]
    assert r.status == "fail"
    assert "a100-03's eth1 runs at 1000 Mb/s, the others at 100000: check its cable/port" in r.detail
    assert "busbw 0.11 GB/s" in r.detail and ">= 9 expected" in r.detail and r.fix


def test_busbw_unknown_link_speed_is_a_skip_not_a_pass():
    vm = {h: facts(h, iface(speed=None)) for h in HOSTS}
    r = by_id(fabric_records(fleet(vm)))["fabric.busbw"]
    assert r.status == "skip" and "not reported" in r.detail and r.measured == 11.0


def test_busbw_at_a_latency_bound_largest_size_gets_no_verdict():
    r = by_id(fabric_records(fleet(rank=rank0(nbytes=1 << 20))))["fabric.busbw"]
    assert r.status == "skip" and "latency-bound" in r.detail


def test_gloo_on_a_fast_link_warns_instead_of_failing():
    r = by_id(fabric_records(fleet(rank=dict(rank0(2.0), backend="gloo"), backend="gloo")))["fabric.busbw"]
    assert r.status == "warn" and "gloo" in r.detail


def test_every_size_gives_a_figures_record_and_the_latency():
    records = by_id(fabric_records(fleet()))
    assert records["fabric.allreduce.4kB"].measured == 0.3 and records["fabric.allreduce.256MB"].measured == 11.0
    assert records["fabric.latency"].measured == 25.0 and records["fabric.latency"].unit == "us"


# ---- the facts behind it ----


def test_speed_names_the_host_interface_and_the_others_speed():
    assert by_id(fabric_records(fleet()))["fabric.speed"].status == "pass"
    r = by_id(fabric_records(fleet({"a100-03": facts("a100-03", iface(speed=1000))})))["fabric.speed"]
    assert r.status == "fail" and "a100-03's eth1 runs at 1000 Mb/s, the others at 100000" in r.detail and "cable" in r.fix


def test_mtu_mismatch_names_the_odd_host():
    assert by_id(fabric_records(fleet()))["fabric.mtu"].status == "pass"
    r = by_id(fabric_records(fleet({"a100-02": facts("a100-02", iface(mtu=1500))})))["fabric.mtu"]
    assert r.status == "fail" and "a100-02's eth1 has MTU 1500, the others 9000" in r.detail and "mtu 9000" in r.fix


def test_interface_on_docker0_fails_and_says_host_networking():
    docker = facts("a100-04", iface("docker0", 10000, 1500, addrs=("172.17.0.1/16",), virtual=True, bridge=True))
    run = fleet({"a100-04": docker}, interface="docker0")
    r = by_id(fabric_records(run))["fabric.interface"]
    assert r.status == "fail" and "a100-04's docker0" in r.detail and "virtual/bridge" in r.detail
    assert "gpurig_fabric.interface" in r.fix and "host networking" in r.fix
    assert by_id(fabric_records(fleet(interface="eth1")))["fabric.interface"].status == "pass"


def test_interface_the_inventory_names_missing_on_a_host_fails():
    other = facts("a100-02", iface("ens5"))
    r = by_id(fabric_records(fleet({"a100-02": other}, interface="eth1")))["fabric.interface"]
    assert r.status == "fail" and "a100-02 has no usable interface by gpurig_fabric.interface eth1" in r.detail


def test_route_to_the_rendezvous_over_another_interface_warns():
    two = facts("a100-02", iface("eth0", addrs=("192.168.1.2/24",)), iface("eth1"), route_dev="eth0")
    r = by_id(fabric_records(fleet({"a100-02": two}, interface="eth1")))["fabric.interface"]
    assert r.status == "warn" and "a100-02 reaches the rendezvous over eth0, while its rank sends over eth1" in r.detail


def test_nccl_default_order_prefers_ib_then_skips_docker_and_lo():
    ifs = [iface("lo", None, 65536, "unknown", ("127.0.0.1/8",), "loopback"), iface("docker0", addrs=("172.17.0.1/16",)),
           iface("eth0"), iface("ib0", kind="infiniband")]
    assert default_interface(ifs, None) == "ib0"
    assert default_interface(ifs[:3], None) == "eth0"
    assert default_interface(ifs[:2], None) == "docker0"
    assert default_interface(ifs, "^ib,eth") == "lo" and default_interface(ifs, "=eth0") == "eth0"
    assert default_interface([iface("eth0", state="down")], None) is None


def test_gloo_default_is_the_interface_holding_the_host_names_address():
    doc = facts("a", iface("eth0", addrs=("192.168.1.5/24",)), iface("eth1"), hostaddr="127.0.1.1")
    link = chosen_link("a", doc, FabricRun(("a",), backend="gloo"))
    assert link.problem and "gloo's default" in link.how  # Debian's 127.0.1.1 in /etc/hosts: gloo would bind no NIC
    doc = facts("a", iface("eth0", addrs=("192.168.1.5/24",)), hostaddr="192.168.1.5")
    assert chosen_link("a", doc, FabricRun(("a",), backend="gloo")).name == "eth0"


def test_rendezvous_unreachable_from_a_host_fails_naming_it():
    assert by_id(fabric_records(fleet()))["fabric.rendezvous"].status == "pass"
    cut = {"a100-03": facts("a100-03", route_error="RTNETLINK answers: Network is unreachable")}
    r = by_id(fabric_records(fleet(cut)))["fabric.rendezvous"]
    assert r.status == "fail" and "10.0.0.1 is unreachable from a100-03: RTNETLINK answers: Network is unreachable" in r.detail
    assert "ip route get" in r.fix


def test_rendezvous_failure_a_rank_reported_fails_and_loopback_master_fails():
    said = {"probe": "fabric", "records": [{"id": "fabric.rendezvous", "status": "fail", "detail": "rank 2 could not meet"}]}
    run = FabricRun(HOSTS, {h: facts(h) for h in HOSTS}, {HOSTS[0]: rank0(), "a100-03": said}, master="10.0.0.1")
    assert "from a100-03: rank 2 could not meet" in by_id(fabric_records(run))["fabric.rendezvous"].detail
    run = FabricRun(HOSTS, {h: facts(h) for h in HOSTS}, {HOSTS[0]: rank0()}, master="127.0.0.1")
    assert "loopback" in by_id(fabric_records(run))["fabric.rendezvous"].detail


def ib_port(state="ACTIVE", rate=200.0, device="mlx5_0"):
    return {"device": device, "port": 1, "state": state, "phys_state": "LinkUp" if state == "ACTIVE" else "Polling",
            "rate": f"{rate:g} Gb/sec (4X HDR)", "rate_gbps": rate, "link_layer": "InfiniBand", "netdevs": ["ib0"]}


def test_ib_port_down_or_slower_on_one_host_fails_naming_it():
    ok = {h: facts(h, ib=[ib_port()], peermem=True) for h in HOSTS}
    assert by_id(fabric_records(fleet(ok)))["fabric.ib"].status == "pass"
    down = dict(ok, **{"a100-02": facts("a100-02", ib=[ib_port("DOWN")], peermem=True)})
    r = by_id(fabric_records(fleet(down)))["fabric.ib"]
    assert r.status == "fail" and "a100-02's mlx5_0 port 1 is DOWN (Polling)" in r.detail and "ibstat" in r.fix
    slow = dict(ok, **{"a100-04": facts("a100-04", ib=[ib_port(rate=100.0)], peermem=True)})
    assert "a100-04's mlx5_0 port 1 runs at 100 Gb/s, the others at 200" in by_id(fabric_records(fleet(slow)))["fabric.ib"].detail
    assert by_id(fabric_records(fleet()))["fabric.ib"].status == "skip"


def test_peermem_missing_where_gpus_and_ib_warns():
    ok = {h: facts(h, ib=[ib_port()], peermem=True) for h in HOSTS}
    assert by_id(fabric_records(fleet(ok)))["fabric.peermem"].status == "pass"
    missing = dict(ok, **{"a100-01": facts("a100-01", ib=[ib_port()], peermem=False)})
    r = by_id(fabric_records(fleet(missing)))["fabric.peermem"]
    assert r.status == "warn" and "not loaded on a100-01" in r.detail and "modprobe nvidia_peermem" in r.fix
    unknown = {h: facts(h, ib=[ib_port()], peermem=None) for h in HOSTS}
    assert by_id(fabric_records(fleet(unknown)))["fabric.peermem"].status == "skip"


# ---- fails closed ----


def test_a_host_left_out_fails_the_level_and_says_why():
    run = fleet(excluded={"a100-04": "host.driver failed"})
    r = by_id(fabric_records(run))["fabric.excluded"]
    assert r.status == "fail" and "a100-04 was left out" in r.detail and "host.driver failed" in r.detail
    assert "a100-04" not in by_id(fabric_records(run))["fabric.speed"].detail


def test_a_run_that_measured_nothing_fails_closed():
    failed = {"probe": "fabric", "sizes": [], "records": [{"id": "fabric.rendezvous", "status": "fail", "detail": "timed out",
                                                            "fix": "open the port"}]}
    records = by_id(fabric_records(fleet(rank=failed)))
    assert records["fabric.checked"].status == "fail" and "timed out" in records["fabric.checked"].detail
    assert records["fabric.busbw"].status == "skip"
    assert by_id(fabric_records(FabricRun(HOSTS[:1], {}, {})))["fabric.checked"].status == "fail"
    assert "fabric.checked" not in by_id(fabric_records(fleet()))


def test_missing_facts_are_skips_never_passes():
    run = FabricRun(HOSTS, {}, {HOSTS[0]: rank0()}, master="10.0.0.1")
    records = by_id(fabric_records(run))
    for rid in ("fabric.busbw", "fabric.speed", "fabric.mtu", "fabric.ib", "fabric.peermem"):
        assert records[rid].status == "skip", rid
    assert records["fabric.interface"].status == "fail" and "were not gathered" in records["fabric.interface"].detail


def test_a_malformed_rank_document_measured_nothing():
    junk = {"probe": "fabric", "sizes": [{"bytes": "lots"}, "x", {"bytes": 4096, "seconds": None, "algbw": 1, "busbw": 1}],
            "records": []}
    records = by_id(fabric_records(fleet(rank=junk)))
    assert records["fabric.checked"].status == "fail" and not any(r.startswith("fabric.allreduce.") for r in records)


def test_rank_zero_is_the_first_host_not_left_out_and_its_backend_counts():
    gloo = dict(rank0(2.0), backend="gloo")
    run = FabricRun(HOSTS, {h: facts(h) for h in HOSTS}, {"a100-02": gloo}, master="10.0.0.1", excluded={"a100-01": "host.driver"})
    assert run.rank0 is gloo and run.as_ran().backend == "gloo"
    assert by_id(fabric_records(run))["fabric.busbw"].status == "warn"  # gloo on 100 Gb/s: CPU-bound, not the link's fault


def test_a_virtual_interface_that_is_no_bridge_is_a_data_path_and_a_bridge_or_veth_is_not():
    # a bond, a VLAN or a container host's own eth0 (a veth seen from inside: sysfs files it under /virtual/) carries the traffic
    bond = {h: facts(h, iface("bond0", 20000, virtual=True), route_dev="bond0") for h in HOSTS}
    r = by_id(fabric_records(FabricRun(HOSTS, bond, {HOSTS[0]: rank0()}, master="10.0.0.1", interface="bond0")))["fabric.interface"]
    assert r.status == "pass" and "a100-01's bond0" in r.detail and "virtual device" in r.detail
    assert "virtual" not in by_id(fabric_records(fleet(interface="eth1")))["fabric.interface"].detail
    # the end of a container network's veth pair on the host, by its name: not a path to the other hosts
    veth = facts("a100-02", iface("veth3f2a1b", 10000, 1500, virtual=True), route_dev="veth3f2a1b")
    r = by_id(fabric_records(fleet({"a100-02": veth}, interface="veth")))["fabric.interface"]
    assert r.status == "fail" and "a100-02's veth3f2a1b" in r.detail and "virtual/bridge" in r.detail


def said_rendezvous(rank):
    return {"probe": "fabric", "sizes": [], "records": [{"id": "fabric.rendezvous", "status": "fail",
                                                         "detail": f"rank {rank} could not meet the other ranks at 10.0.0.1:29500"}]}


def test_a_rendezvous_no_other_rank_got_through_to_names_rank_0s_host_and_its_port():
    ranks = {h: said_rendezvous(i) for i, h in enumerate(HOSTS)}
    run = FabricRun(HOSTS, {h: facts(h) for h in HOSTS}, ranks, master="10.0.0.1", port=29500)
    r = by_id(fabric_records(run))["fabric.rendezvous"]
    assert r.status == "fail"
    assert r.detail.startswith("a100-01 (rank 0) holds 10.0.0.1 on eth1, but no other rank got through to its port 29500: "
                               "a firewall on a100-01, or on the way to it, drops it; from a100-01: rank 0 could not meet")
    assert r.fix.startswith("open TCP port 29500 on a100-01 to the other hosts")
    # one rank alone failed: not rank 0's port (the others got through): the host is named by its own line, no cause said
    run = FabricRun(HOSTS, {h: facts(h) for h in HOSTS}, {HOSTS[0]: rank0(), "a100-03": said_rendezvous(2)}, master="10.0.0.1", port=29500)
    r = by_id(fabric_records(run))["fabric.rendezvous"]
    assert r.detail.startswith("from a100-03: rank 2") and "ip route get" in r.fix


def test_a_rendezvous_address_rank_0_does_not_hold_is_named_with_what_it_holds():
    ranks = {h: said_rendezvous(i) for i, h in enumerate(HOSTS)}
    docker0 = iface("docker0", None, 1500, addrs=("172.17.0.1/16",), virtual=True, bridge=True)
    docs = {h: facts(h, iface(addrs=("10.0.0.1/24", "fe80::1/64")), docker0) for h in HOSTS}
    run = FabricRun(HOSTS, docs, ranks, master="192.0.2.254", port=29500)
    r = by_id(fabric_records(run))["fabric.rendezvous"]
    assert r.status == "fail"
    assert r.detail.startswith("192.0.2.254 is not an address of a100-01 (rank 0, which holds 10.0.0.1 on eth1): no rank answers "
                               "there, unless it is forwarded to a100-01; from a100-01:")
    assert r.fix.startswith("set gpurig_fabric.address on a100-01 to an address it holds")
    # an address rank 0 does not hold is no fault while the ranks meet there (a NAT that forwards it)
    run = FabricRun(HOSTS, {h: facts(h) for h in HOSTS}, {HOSTS[0]: rank0()}, master="192.0.2.254", port=29500)
    assert by_id(fabric_records(run))["fabric.rendezvous"].status == "pass"


def test_gloo_on_10_gbe_itself_warns_and_on_a_slower_link_fails():
    ten = {h: facts(h, iface(speed=10000)) for h in HOSTS}  # 10000 Mb/s: promise 1.25 x 0.9, floor 0.9 GB/s
    run = FabricRun(HOSTS, ten, {HOSTS[0]: dict(rank0(0.4), backend="gloo")}, master="10.0.0.1", backend="gloo")
    r = by_id(fabric_records(run))["fabric.busbw"]
    assert r.status == "warn" and "gloo reduces on the CPU" in r.detail
    one = {h: facts(h, iface(speed=1000)) for h in HOSTS}  # 1 GbE: floor 0.09 GB/s, gloo keeps up with it
    run = FabricRun(HOSTS, one, {HOSTS[0]: dict(rank0(0.05), backend="gloo")}, master="10.0.0.1", backend="gloo")
    assert by_id(fabric_records(run))["fabric.busbw"].status == "fail"

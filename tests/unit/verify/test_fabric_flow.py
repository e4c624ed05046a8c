"""The fabric level's orchestration, its pure decisions (gpurig/flows/fabricverify.py): who is left out, who is rank 0 and
where the ranks meet, what each rank is told, what a culprit test measured; and gpurig_fabric as the inventory declares it.

The facts and rank documents are shaped as checks/fabric_facts.py and
checks/fabric_allreduce.py print them (tests/unit/verify/test_fabric_rules.py's
builders); the verify verdicts are records as verify_host returns them.
"""

from __future__ import annotations

import dataclasses

import pytest

from gpurig.errors import InventoryError
from gpurig.flows import fabricverify as fv
from gpurig.inventory import Host
from gpurig.inventory.profile import FabricSettings, host_profile
from gpurig.verify.fabric import FabricRun, missing_interfaces
from gpurig.verify.fabric_checks import fabric_records
from gpurig.verify.records import HostVerdict, Record
from tests.unit.verify.test_fabric_rules import facts, iface, rank0

NO_GPU = Record("toolkit", "toolkit.runtime", "skip", detail="no NVIDIA GPU visible on the host (nvidia-smi -L): no runtime to check")


def verdict(*records):
    return HostVerdict("h", tuple(records), "quick", "image x")


def fail(rid, detail="broken", fix="do this"):
    return Record("container", rid, "fail", detail=detail, fix=fix)


# ---- who is left out ----


def test_a_gpu_host_failing_any_record_is_left_out_with_the_record_and_its_fix():
    assert fv.exclusion(verdict(fail("cuda.available", "no CUDA", "install the driver"))) == "cuda.available: no CUDA; install the driver"
    assert fv.exclusion(verdict(Record("host", "driver.loaded", "pass"))) is None


def test_a_host_without_gpus_runs_gloo_and_is_left_out_only_for_what_gloo_needs():
    assert fv.exclusion(verdict(NO_GPU, fail("cuda.available"), fail("host.gpus"))) is None
    missing = fail("container.probe", "image x:1 is not on this host: No such image", "deploy it first (gpurig deploy)")
    assert fv.exclusion(verdict(NO_GPU, missing)) == "container.probe: image x:1 is not on this host: No such image; deploy it first (gpurig deploy)"
    assert fv.exclusion(verdict(NO_GPU, fail("torch.import", "No module named torch"))).startswith("torch.import: No module named torch")
    assert not fv.has_gpus(verdict(NO_GPU)) and fv.has_gpus(verdict()) and not fv.has_gpus(None)


def test_an_unreachable_host_is_left_out_with_the_fleets_reason():
    assert fv.exclusion(None, "ssh: connection refused") == "ssh: connection refused"
    assert fv.exclusion(None) == "it could not be verified"


def test_a_run_with_hosts_left_out_fails_and_names_them():
    run = FabricRun(("a", "b", "c"), {h: facts(h) for h in "abc"}, {"a": rank0(world=2)}, master="10.0.0.1",
                    excluded={"c": "torch.import: No module named torch"})
    assert run.ranked == ("a", "b")
    got = {r.id: r for r in fabric_records(run)}
    assert got["fabric.excluded"].status == "fail" and "c was left out" in got["fabric.excluded"].detail


# ---- where the ranks meet ----


def test_rank_0s_address_is_the_one_on_the_interface_its_rank_uses():
    first = facts("a", iface("eth0", addrs=("192.168.1.5/24", "fe80::1/64")), iface("ib0", addrs=("10.9.0.5/16",)))
    run = FabricRun(("a", "b"), {"a": first}, interface="eth0", backend="gloo")
    assert fv.master_address(run, "a", FabricSettings(interface="eth0")) == ("192.168.1.5", "a's eth0's address (gpurig_fabric.interface eth0)")


def test_gpurig_fabric_address_wins_over_the_facts():
    run = FabricRun(("a", "b"), {}, interface="eth0")
    assert fv.master_address(run, "a", FabricSettings(address="10.1.2.3")) == ("10.1.2.3", "a's gpurig_fabric.address")


def test_no_usable_interface_is_no_address_and_says_why():
    run = FabricRun(("a", "b"), {"a": facts("a", iface("eth0"))}, interface="nosuch0")
    addr, why = fv.master_address(run, "a", FabricSettings(interface="nosuch0"))
    assert addr is None and "a has no usable interface by gpurig_fabric.interface nosuch0" in why
    assert fv.master_address(FabricRun(("a", "b")), "a", FabricSettings()) == (None, "its fabric facts were not gathered")


def test_interface_address_prefers_ipv4_then_global_ipv6_never_link_local():
    doc = facts("a", iface("eth0", addrs=("fe80::2/64", "fd00::2/64", "192.0.2.2/24")))
    assert fv.interface_address(doc, "eth0") == "192.0.2.2"
    assert fv.interface_address(facts("a", iface("eth0", addrs=("fe80::2/64", "fd00::2/64"))), "eth0") == "fd00::2"
    assert fv.interface_address(facts("a", iface("eth0", addrs=("fe80::2/64",))), "eth0") is None
    assert fv.interface_address(doc, "eth9") is None and fv.interface_address(None, "eth0") is None


# ---- what each rank is told ----


def test_every_rank_gets_the_same_world_rendezvous_and_sizes_and_its_own_rank_and_interface():
    args = [fv.rank_args(i, 3, "10.0.0.1", 29511, (4096, 1 << 20), 15, iface) for i, iface in enumerate(("eth0", None, "ib0"))]
    assert args[0] == ["--json", "--rank", "0", "--world", "3", "--master-addr", "10.0.0.1", "--master-port", "29511",
                       "--sizes", "4096,1048576", "--iters", "20", "--timeout", "15", "--interface", "eth0"]
    assert args[1][:3] == ["--json", "--rank", "1"] and "--interface" not in args[1]
    assert args[2][-2:] == ["--interface", "ib0"]


def test_the_exec_timeout_outlasts_the_probes_own_watchdog():
    # the rendezvous (timeout + 5), the warm-up, the latency and each of 9 sizes: 12 phases of 60 s, and a minute to start
    assert fv.rank_timeout(60, 9) == 60 * 12 + 60 > 60 + 5 + 60 * 11


def test_the_rank_container_uses_host_networking_the_label_and_gpus_only_where_there_are():
    body = fv.container_body("img:1", ["python3", "-c", "boot", "--json"], "ab12", gpus=False)
    assert body["Image"] == "img:1" and body["Entrypoint"] == ["python3"] and body["Cmd"] == ["-c", "boot", "--json"]
    assert body["HostConfig"]["NetworkMode"] == "host" and body["Labels"] == {fv.FABRIC_LABEL: "ab12"}
    assert "DeviceRequests" not in body["HostConfig"]
    assert fv.container_body("img:1", ["python3"], "ab12", gpus=True)["HostConfig"]["DeviceRequests"][0]["Count"] == -1


# ---- what a culprit test measured ----


def test_a_culprit_test_is_rank_0s_busbw_at_its_largest_size():
    assert fv.largest_busbw(rank0(busbw_gbs=7.5, world=2)) == 7.5


def test_a_culprit_test_that_failed_or_measured_nothing_is_none():
    failed = {**rank0(), "records": [{"id": "fabric.rendezvous", "status": "fail", "detail": "timed out"}]}
    assert fv.largest_busbw(failed) is None
    assert fv.largest_busbw({"probe": "fabric", "sizes": [], "records": []}) is None
    assert fv.largest_busbw(None) is None


def test_the_culprit_search_runs_only_when_the_busbw_falls_short():
    assert fv.needs_culprit([Record("fabric", "fabric.busbw", "fail")]) and fv.needs_culprit([Record("fabric", "fabric.busbw", "warn")])
    assert not fv.needs_culprit([Record("fabric", "fabric.busbw", "pass"), Record("fabric", "fabric.busbw.x", "fail")])


# ---- gpurig_fabric in the inventory ----


def profile(value):
    return host_profile(Host("n1", (), {"gpurig_fabric": value}), "hosts.yaml").fabric


def test_gpurig_fabric_is_declared_with_its_keys_and_defaults():
    assert profile({}) == FabricSettings(None, None, 29500, 60, 256)
    assert profile({"interface": "^docker,lo", "address": "10.0.0.11", "port": 29511, "timeout": 15, "max_size_mb": 64}) == FabricSettings(
        "^docker,lo", "10.0.0.11", 29511, 15, 64)


def test_the_sizes_measured_stop_at_gpurig_fabric_max_size_mb():
    assert fv.sizes_up_to(256) == fv.DEFAULT_SIZES and len(fv.DEFAULT_SIZES) == 9
    assert fv.sizes_up_to(64) == (4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
    assert fv.sizes_up_to(100)[-1] == 64 << 20 and fv.sizes_up_to(1) == (4096, 16384, 65536, 262144, 1 << 20)


@pytest.mark.parametrize(("value", "said"), [
    ({"interfce": "eth0"}, "gpurig_fabric.interfce is not a known key"),
    ({"interface": "eth0; reboot"}, "gpurig_fabric.interface must be a string like 'eth0'"),
    ({"address": "$(id)"}, "gpurig_fabric.address must be a string like"),
    ({"port": 80}, "gpurig_fabric.port must be from 1024 to 65535, not 80"),
    ({"timeout": "15"}, "gpurig_fabric.timeout must be a whole number"),
    ({"max_size_mb": 512}, "gpurig_fabric.max_size_mb must be from 1 to 256, not 512"),
    ("eth0", "gpurig_fabric must be a mapping"),
])
def test_gpurig_fabric_mistakes_are_one_error_naming_the_key(value, said):
    with pytest.raises(InventoryError, match="hosts.yaml: host n1: ") as err:
        profile(value)
    assert said in err.value.problem


# ---- the culprit search's measurements (a slow host cannot exist here: the pairs' runs are a stand-in) ----


def test_a_short_busbw_reruns_pairs_at_the_largest_size_and_names_the_host_slow_with_every_partner():
    hosts = ("a", "b", "c", "d")
    run = FabricRun(hosts, {h: facts(h) for h in hosts}, {"a": rank0(busbw_gbs=3.0)}, master="10.0.0.1", backend="nccl")
    settings = {h: FabricSettings(interface="eth1") for h in hosts}
    asked = []

    def pairs(ranks, subset, master, settings, port, sizes):
        asked.append((subset, master, port, sizes))
        return {subset[0]: rank0(busbw_gbs=4.0 if "c" in subset else 11.0, world=len(subset))}

    ranks = fv.Ranks("img:1", {}, {}, "", "")
    got = {r.id: r for r in fv.fabric_records_with_culprit(ranks, run, settings, runner=pairs)}
    assert got["fabric.busbw"].status == "fail"
    assert got["fabric.culprit"].status == "fail" and got["fabric.culprit"].measured == ["c"]
    assert "c is slow with every partner" in got["fabric.culprit"].detail
    assert [a[0] for a in asked] == [("a", "b"), ("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"), ("c", "d"),
                                     ("a", "c"), ("b", "c"), ("c", "d")]  # every pair, then the slow ones once more (4.0 of 9)
    assert {(a[1], a[2], a[3]) for a in asked} == {("10.0.0.1", 29500, (256 << 20,))}


def test_a_pair_whose_run_failed_counts_as_slow_and_a_busbw_that_passes_runs_no_pair():
    hosts = ("a", "b", "c")
    run = FabricRun(hosts, {h: facts(h) for h in hosts}, {"a": rank0(busbw_gbs=3.0, world=3)}, master="10.0.0.1")
    settings = {h: FabricSettings() for h in hosts}
    failed = {"probe": "fabric", "sizes": [], "records": [{"id": "fabric.rendezvous", "status": "fail", "detail": "timed out"}]}

    def pairs(ranks, subset, master, settings, port, sizes):
        return {subset[0]: failed if "b" in subset else rank0(busbw_gbs=11.0, world=2)}

    got = {r.id: r for r in fv.fabric_records_with_culprit(fv.Ranks("img:1", {}, {}, "", ""), run, settings, runner=pairs)}
    assert got["fabric.culprit"].measured == ["b"] and "failed" in got["fabric.culprit"].detail
    fine = FabricRun(hosts, {h: facts(h) for h in hosts}, {"a": rank0(busbw_gbs=11.0, world=3)}, master="10.0.0.1")
    none = fv.fabric_records_with_culprit(fv.Ranks("img:1", {}, {}, "", ""), fine, settings, runner=lambda *a: pytest.fail("no pair"))
    assert "fabric.culprit" not in {r.id for r in none}


def test_each_hosts_own_interface_is_judged_against_its_own_facts():
    run = FabricRun(("a", "b"), {h: facts(h) for h in "ab"}, {"a": rank0(world=2)}, master="10.0.0.1",
                    interface="eth1", interfaces={"a": "eth1", "b": "nosuch0"})
    got = {r.id: r for r in fabric_records(run)}["fabric.interface"]
    assert got.status == "fail" and got.detail == "b: b has no usable interface by gpurig_fabric.interface nosuch0 (up, with an address)"
    assert run.interface_of("a") == "eth1" and run.interface_of("c") == "eth1"  # a host the run has no setting of: the run's
    assert FabricRun(("a",), interface="eth1", interfaces={"a": None}).interface_of("a") is None


def test_the_fabric_level_needs_the_image_the_hosts_train_in():
    from gpurig.errors import ConfigError
    from gpurig.verify.gate import make_plan

    with pytest.raises(ConfigError, match="--level fabric needs --image"):
        make_plan(None, None, "fabric")
    with pytest.raises(ConfigError, match="--level fabric needs --image"):
        make_plan("train", None, "fabric")
    plan = make_plan(None, "registry.example.com/ml/pytorch:2.9.1-cu128-slim", "fabric")
    assert plan.level == "fabric" and plan.image.endswith("-slim") and plan.torch_probe


def test_a_host_whose_facts_show_no_such_interface_starts_no_rank_and_the_run_says_why():
    """The others would wait their whole timeout for a rank that cannot send: the facts already say so, so no rank starts."""
    hosts = ("a", "b", "c")

    class Seen(fv.Ranks):
        def facts(self, host, to):
            return facts(host)

        def rank(self, host, args, timeout):
            pytest.fail(f"a rank was started on {host}")

    run = FabricRun(hosts, interfaces={"c": "nosuch0"}, backend="gloo")
    settings = {h: FabricSettings(interface="nosuch0" if h == "c" else None) for h in hosts}
    gathered = fv.gather(Seen("img:1", {}, {}, "", ""), run, settings)
    assert gathered.ranks == {} and gathered.master == "10.0.0.1"
    why = "c has no usable interface by gpurig_fabric.interface nosuch0 (up, with an address)"
    assert gathered.not_started == why
    got = {r.id: r for r in fabric_records(gathered)}
    assert got["fabric.interface"].status == "fail" and got["fabric.interface"].detail == f"c: {why}"
    assert got["fabric.checked"].status == "fail"
    assert got["fabric.checked"].detail == f"nothing was measured: the ranks were not started, as {why}"
    assert missing_interfaces(dataclasses.replace(gathered, interfaces={})) == ""  # every host has a usable one: ranks go


def test_pairs_short_of_the_promise_are_judged_against_the_best_one_and_none_slower_passes():
    # gloo on 10 GbE: the ring and every pair under the 0.9 GB/s floor, as the CPUs limit them
    hosts = ("a", "b", "c")
    ten = {h: facts(h, iface(speed=10000)) for h in hosts}
    run = FabricRun(hosts, ten, {"a": dict(rank0(busbw_gbs=0.4, world=3), backend="gloo")}, master="10.0.0.1", backend="gloo")
    settings = {h: FabricSettings() for h in hosts}

    def even(ranks, subset, master, settings, port, sizes):
        return {subset[0]: rank0(busbw_gbs=0.7, world=2)}

    got = {r.id: r for r in fv.fabric_records_with_culprit(fv.Ranks("img:1", {}, {}, "", ""), run, settings, runner=even)}
    assert got["fabric.busbw"].status == "warn"
    assert got["fabric.culprit"].status == "pass" and "half the best pair's busbw: gloo's CPUs, not the links, set the pace" in got["fabric.culprit"].detail

    def around_the_promise(ranks, subset, master, settings, port, sizes):  # seen: two pairs just over 0.9, one just under
        return {subset[0]: rank0(busbw_gbs=0.8 if subset == ("b", "c") else 0.95, world=2)}

    got = {r.id: r for r in fv.fabric_records_with_culprit(fv.Ranks("img:1", {}, {}, "", ""), run, settings, runner=around_the_promise)}
    assert got["fabric.culprit"].status == "pass", got["fabric.culprit"]  # not "the link b <-> c is slow"

    def one_slow(ranks, subset, master, settings, port, sizes):
        return {subset[0]: rank0(busbw_gbs=0.1 if "b" in subset else 0.7, world=2)}

    got = {r.id: r for r in fv.fabric_records_with_culprit(fv.Ranks("img:1", {}, {}, "", ""), run, settings, runner=one_slow)}
    assert got["fabric.culprit"].status == "fail" and got["fabric.culprit"].measured == ["b"]

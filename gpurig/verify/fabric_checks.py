"""The fabric level's records, pure: one rule per check, each a ``Record`` (probe "fabric") with the host or link it blames.

``fabric_records(run)`` is every record of a fabric run, in the order a person
reads them: the figures per size, the busbw verdict, then the facts behind it
(interface, rendezvous, speed, MTU, InfiniBand, GPUDirect RDMA), hosts left
out, and ``fabric.checked`` failing a run that measured nothing. The
thresholds and what the links promise are gpurig/verify/fabric.py's; a fact
not read is a ``skip`` naming why, never a pass.
"""

from __future__ import annotations

import ipaddress
import statistics
from collections.abc import Mapping
from typing import Any

from gpurig.errors import counted
from gpurig.verify.fabric import (
    FIX_INTERFACE,
    GLOO_LINK_LIMIT_MBPS,
    MIN_VERDICT_BYTES,
    PASS_FRACTION,
    VIRTUAL_PREFIXES,
    FabricRun,
    Link,
    ib_rates,
    links,
    promise,
    size_label,
    sizes,
)
from gpurig.verify.records import Record


def rec(rid: str, status: str, measured: Any = None, expected: Any = None, unit: str = "", detail: str = "", fix: str = "") -> Record:
    return Record("fabric", rid, status, measured, expected, unit, detail, fix)


def size_records(rank0: Mapping[str, Any] | None) -> list[Record]:
    """One figures record per message size rank 0 measured, and its 8-byte latency."""
    out = []
    for s in sizes(rank0):
        out.append(rec(f"fabric.allreduce.{size_label(int(s['bytes']))}", "pass", float(f"{s['busbw']:.4g}"), None, "GB/s",
                       f"time {s['seconds'] * 1e3:.4g} ms (median of {s.get('iters')}), algbw {s['algbw']:.4g} GB/s, "
                       f"busbw {s['busbw']:.4g} GB/s"))
    latency = (rank0 or {}).get("latency_us")
    if isinstance(latency, (int, float)):
        out.append(rec("fabric.latency", "pass", latency, None, "us", "median 8-byte all-reduce: the small-message latency"))
    return out


def slowest(run: FabricRun) -> Link | None:
    known = [lk for lk in links(run) if lk.speed_mbps]
    return min(known, key=lambda lk: lk.speed_mbps or 0) if known else None


def busbw_record(run: FabricRun) -> Record:
    """The busbw at the largest size against the links' promise."""
    measured = sizes(run.rank0)
    if not measured:
        return rec("fabric.busbw", "skip", detail="skipped: rank 0 measured no size")
    last = measured[-1]
    got, nbytes = float(last["busbw"]), int(last["bytes"])
    expected, how = promise(run)
    label = size_label(nbytes)
    if expected is None:
        return rec("fabric.busbw", "skip", round(got, 3), None, "GB/s", f"busbw {got:g} GB/s at {label}; no verdict: {how}",
                   "set the expected speed by checking the NICs' datasheet; /sys/class/net/IFACE/speed reads -1 here")
    floor = expected * PASS_FRACTION
    shown = f">= {floor:.3g}"
    if nbytes < MIN_VERDICT_BYTES:
        return rec("fabric.busbw", "skip", round(got, 3), shown, "GB/s",
                   f"the largest size, {label}, is latency-bound: rerun with sizes up to 256 MB for a verdict")
    if got >= floor:
        return rec("fabric.busbw", "pass", round(got, 3), shown, "GB/s",
                   f"busbw {got:g} GB/s at {label} across {len(links(run))} hosts: {got / expected:.0%} of {how}")
    slow = slowest(run)
    speeds = sorted({lk.speed_mbps for lk in links(run) if lk.speed_mbps})
    culprit = (f"{slow.where} runs at {slow.speed_mbps} Mb/s, the others at {speeds[-1]}: check its cable/port; "
               if slow and len(speeds) > 1 and slow.speed_mbps == speeds[0] else "")
    cpu_bound = run.backend == "gloo" and (slow is None or (slow.speed_mbps or 0) >= GLOO_LINK_LIMIT_MBPS)
    return rec("fabric.busbw", "warn" if cpu_bound and not culprit else "fail", round(got, 3), shown, "GB/s",
               f"{culprit}busbw {got:.3g} GB/s at {label} against {shown} expected ({how})"
               + ("; gloo reduces on the CPU and rarely fills links of 10 Gb/s or more" if cpu_bound else ""),
               "fix the slow link named; then rerun verify --level fabric" if culprit else
               "look at the pairwise results (fabric.culprit) for the slow host or link; check NCCL_DEBUG=INFO's chosen transport")


def speed_record(run: FabricRun) -> Record:
    """An interface slower than the others': names host, interface, its speed and theirs."""
    known = [lk for lk in links(run) if lk.speed_mbps]
    unknown = [lk.where for lk in links(run) if not lk.speed_mbps]
    if len(known) < 2:
        return rec("fabric.speed", "skip", detail=f"skipped: link speed not known for {', '.join(unknown) or 'the hosts'}")
    top = max(lk.speed_mbps or 0 for lk in known)
    slow = [lk for lk in known if (lk.speed_mbps or 0) < top]
    also = f"; not reported for {', '.join(unknown)}" if unknown else ""
    if not slow:
        return rec("fabric.speed", "pass", top, top, "Mb/s", f"every host's interface runs at {top} Mb/s{also}")
    said = "; ".join(f"{lk.where} runs at {lk.speed_mbps} Mb/s" for lk in slow)
    return rec("fabric.speed", "fail", [lk.speed_mbps for lk in slow], top, "Mb/s", f"{said}, the others at {top}{also}",
               "check its cable, transceiver and switch port (ethtool IFACE: Speed, auto-negotiation); the slowest link paces every all-reduce")


def mtu_record(run: FabricRun) -> Record:
    known = [lk for lk in links(run) if lk.mtu]
    if len(known) < 2:
        return rec("fabric.mtu", "skip", detail="skipped: MTU known for fewer than two hosts")
    counts = statistics.multimode(lk.mtu or 0 for lk in known)
    usual = max(counts)
    odd = [lk for lk in known if lk.mtu != usual]
    if not odd:
        return rec("fabric.mtu", "pass", usual, usual, "bytes", f"every host's interface has MTU {usual}")
    return rec("fabric.mtu", "fail", [lk.mtu for lk in odd], usual, "bytes",
               "; ".join(f"{lk.where} has MTU {lk.mtu}" for lk in odd) + f", the others {usual}: large frames are dropped or fragmented",
               f"set MTU {usual} on it (ip link set dev IFACE mtu {usual}, and in netplan/NetworkManager to keep it), and on the switch ports")


def interface_record(run: FabricRun) -> Record:
    """The interface each rank uses exists, is up, is a data path (not docker0/a bridge/loopback) and is where the route goes.

    A virtual device that is no bridge (a bond, a VLAN, a macvlan, a container host's own eth0) is the host's data
    path, said in the detail; whether it reaches the others is the rendezvous' record.
    """
    bad, odd, seen = [], [], []
    for lk in links(run):
        route = _route_to(run.facts.get(lk.host), run.master)
        if lk.problem:
            bad.append(f"{lk.host}: {lk.problem}")
        elif lk.plumbing:
            bad.append(f"{lk.where} ({lk.how}) is a virtual/bridge interface: traffic to other hosts goes through NAT or nowhere")
        elif lk.operstate not in ("up", "unknown"):
            bad.append(f"{lk.where} ({lk.how}) is {lk.operstate}")
        elif route and route.get("dev") and route["dev"] != lk.name and not route.get("local"):
            odd.append(f"{lk.host} reaches the rendezvous over {route['dev']}, while its rank sends over {lk.name} ({lk.how})")
        seen.append(f"{lk.host}: {lk.name}")
    if bad:
        container = " (or run the image with host networking: a container's own eth0 is a veth)" if any("virtual" in b for b in bad) else ""
        return rec("fabric.interface", "fail", seen, run.interface, "", "; ".join(bad), FIX_INTERFACE + container)
    if odd:
        return rec("fabric.interface", "warn", seen, run.interface, "", "; ".join(odd) + ": fine when the data network is "
                   "another than the rendezvous', a mistake when it is not", FIX_INTERFACE)
    virtual = [lk.where for lk in links(run) if lk.virtual]
    also = f" ({', '.join(virtual)}: a virtual device, as a bond, a VLAN or a container host's own veth is)" if virtual else ""
    return rec("fabric.interface", "pass", seen, run.interface, "", f"every host sends over an up interface that is no bridge{also}")


def _route_to(facts: Mapping[str, Any] | None, addr: str) -> Mapping[str, Any] | None:
    return next((r for r in (facts or {}).get("routes") or () if r.get("to") == addr), None)


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


def rendezvous_record(run: FabricRun) -> Record:
    """The rendezvous address reachable from every host: its route in each host's facts, and each rank's own word."""
    bad: list[str] = []
    failed: list[str] = []  # the hosts whose rank said it could not meet the others
    hosts = [h for h in run.hosts if h not in run.excluded]
    if _loopback(run.master) and len(hosts) > 1:
        bad.append(f"{run.master} is a loopback address: each host reaches only itself")
    for host in hosts:
        route, ranked = _route_to(run.facts.get(host), run.master), run.ranks.get(host) or {}
        said = next((r for r in ranked.get("records") or () if r.get("id") == "fabric.rendezvous" and r.get("status") == "fail"), None)
        if said:
            bad.append(f"from {host}: {said.get('detail')}")
            failed.append(host)
        elif route and route.get("error"):
            bad.append(f"{run.master} is unreachable from {host}: {route['error']}")
        elif route and str(route.get("dev", "")).startswith(VIRTUAL_PREFIXES[:4]) and not route.get("local"):
            bad.append(f"{host} routes {run.master} over {route['dev']}, a local bridge: the address is not another host's")
    if bad:
        cause, fix = rendezvous_cause(run, failed)
        return rec("fabric.rendezvous", "fail", None, run.master, "", "; ".join(([cause] if cause else []) + bad),
                   fix or "use rank 0's address on a network every host routes to (ip route get ADDR on each), and open its TCP port")
    checked = [h for h in hosts if _route_to(run.facts.get(h), run.master) or h in run.ranks]
    if not checked:
        return rec("fabric.rendezvous", "skip", None, run.master, "", "skipped: no host's route or rank output was gathered")
    return rec("fabric.rendezvous", "pass", len(checked), len(hosts), "hosts", f"{run.master} is reachable from {', '.join(checked)}")


def held_addresses(facts: Mapping[str, Any] | None, data_only: bool = False) -> dict[str, str]:
    """{address: interface} of every address a host's facts show, without prefix lengths; ``data_only``: not those of
    loopback, bridges (docker0) or a container network's devices, nor link-local ones."""
    held = {}
    for iface in (facts or {}).get("interfaces") or ():
        name = str(iface.get("name"))
        if data_only and (iface.get("type") == "loopback" or iface.get("bridge") or name.startswith(VIRTUAL_PREFIXES)):
            continue
        for text in iface.get("addresses") or ():
            addr = str(text).split("/")[0].lower()
            if not (data_only and (addr.startswith("fe80:") or _loopback(addr))):
                held[addr] = name
    return held


def rendezvous_cause(run: FabricRun, failed: list[str]) -> tuple[str, str]:
    """(what the facts say of a rendezvous the ranks of ``failed`` could not make, its fix); ("", "") when they say nothing.

    Rank 0's host does not hold the address (nobody answers there, unless it is forwarded to it), or it does and no
    other rank got through to its port (a firewall on it or on the way).
    """
    hosts = [h for h in run.hosts if h not in run.excluded]
    if not failed or len(hosts) < 2 or not run.facts.get(hosts[0]) or _loopback(run.master):
        return "", ""
    first, port = hosts[0], f"port {run.port}" if run.port else "its port"
    held = held_addresses(run.facts.get(first))
    if run.master.lower() not in held:
        shown = ", ".join(f"{a} on {i}" for a, i in held_addresses(run.facts.get(first), data_only=True).items()) or "no address"
        return (f"{run.master} is not an address of {first} (rank 0, which holds {shown}): no rank answers there, unless it is "
                f"forwarded to {first}",
                f"set gpurig_fabric.address on {first} to an address it holds that the other hosts reach (ip -o addr on {first}), "
                "or remove it: its rank's interface address is used")
    others = [h for h in hosts[1:] if h in failed]
    if others != hosts[1:]:
        return "", ""
    return (f"{first} (rank 0) holds {run.master} on {held[run.master.lower()]}, but no other rank got through to its {port}: "
            f"a firewall on {first}, or on the way to it, drops it",
            f"open TCP {port} on {first} to the other hosts (iptables -S INPUT, nft list ruleset, ufw status; a cloud's security "
            f"group), or set gpurig_fabric.port on {first} to a port that is open")


def ib_record(run: FabricRun) -> Record:
    """InfiniBand/RoCE ports: one down where the other hosts have it active, or slower than theirs."""
    ports = {h: list((run.facts.get(h) or {}).get("infiniband") or ()) for h in run.hosts if h not in run.excluded}
    if not any(ports.values()):
        return rec("fabric.ib", "skip", detail="skipped: no InfiniBand or RoCE port on any host (/sys/class/infiniband)")
    names = sorted({(p.get("device"), p.get("port")) for ps in ports.values() for p in ps}, key=str)
    problems = []
    for device, port in names:
        seen = {h: next((p for p in ps if (p.get("device"), p.get("port")) == (device, port)), None) for h, ps in ports.items()}
        active = {h: p for h, p in seen.items() if p and p.get("state") == "ACTIVE"}
        if not active:
            continue  # down everywhere: a port this fleet does not cable
        for host, p in seen.items():
            if host not in active:
                state = f"{p.get('state')} ({p.get('phys_state')})" if p else "missing"
                problems.append(f"{host}'s {device} port {port} is {state}, ACTIVE on {', '.join(sorted(active))}")
        rates = {h: p.get("rate_gbps") for h, p in active.items() if isinstance(p.get("rate_gbps"), (int, float))}
        top = max(rates.values(), default=0)
        problems += [f"{h}'s {device} port {port} runs at {r:g} Gb/s, the others at {top:g}" for h, r in sorted(rates.items()) if r < top]
    if problems:
        return rec("fabric.ib", "fail", len(problems), 0, "ports", "; ".join(problems),
                   "check that port's cable and switch port (ibstat: State, Physical state, Rate); a port in Polling has no link, "
                   "Init/Armed waits for the subnet manager (opensm)")
    up = sum(1 for ps in ports.values() for p in ps if p.get("state") == "ACTIVE")
    return rec("fabric.ib", "pass", up, None, "ports", "every port active on one host is active at the same rate on all")


def peermem_record(run: FabricRun) -> Record:
    """GPUDirect RDMA: nvidia_peermem loaded where NCCL runs over InfiniBand; without it NCCL stages through host memory."""
    hosts = [h for h in run.hosts if h not in run.excluded and ib_rates(run.facts.get(h))]
    if run.backend != "nccl" or not hosts:
        return rec("fabric.peermem", "skip", detail="skipped: needs GPUs (nccl) and an active InfiniBand/RoCE port")
    unknown = [h for h in hosts if (run.facts.get(h) or {}).get("peermem") is None]
    missing = [h for h in hosts if (run.facts.get(h) or {}).get("peermem") is False]
    if missing:
        return rec("fabric.peermem", "warn", missing, "loaded", "", f"nvidia_peermem is not loaded on {', '.join(missing)}: "
                   "no GPUDirect RDMA, NCCL copies every message through host memory",
                   "sudo modprobe nvidia_peermem, and list it in /etc/modules-load.d/ to keep it after a reboot")
    if unknown:
        return rec("fabric.peermem", "skip", detail=f"skipped: /proc/modules not readable on {', '.join(unknown)}")
    return rec("fabric.peermem", "pass", "loaded", "loaded", "", f"nvidia_peermem loaded on {', '.join(hosts)}")


def excluded_records(run: FabricRun) -> list[Record]:
    """A host kept out because its single-host verify failed: the fabric was not proven for it, and that fails the level."""
    return [rec("fabric.excluded", "fail", host, None, "", f"{host} was left out of the fabric test: its single-host verify "
                f"failed ({why}); the fabric is proven for the other hosts only",
                f"fix {host} first (its verify records say how), then rerun verify --level fabric") for host, why in run.excluded.items()]


def checked_record(run: FabricRun) -> Record | None:
    """Fails closed: fewer than two hosts, or rank 0 measured nothing, is no proof."""
    hosts = [h for h in run.hosts if h not in run.excluded]
    if len(hosts) < 2:
        return rec("fabric.checked", "fail", len(hosts), ">= 2", "hosts", f"nothing was checked: {counted(len(hosts), 'host')} left to "
                   "all-reduce across", "select at least two hosts whose single-host verify passes")
    if run.not_started:
        return rec("fabric.checked", "fail", None, None, "", f"nothing was measured: the ranks were not started, as {run.not_started}",
                   "fix what fabric.interface names, then rerun verify --level fabric")
    rank0 = run.rank0
    if not rank0 or not sizes(rank0):
        failed = next((r for r in (rank0 or {}).get("records") or () if r.get("status") == "fail"), None)
        why = failed.get("detail") if failed else "rank 0 gave no document" if not rank0 else "rank 0 measured no size"
        return rec("fabric.checked", "fail", None, None, "", f"nothing was measured: {why}",
                   (failed or {}).get("fix") or "run checks/fabric_allreduce.py --text by hand on each host to see why")
    return None


def rank_failures(run: FabricRun) -> list[Record]:
    """A rank's own failure records other than the rendezvous' (fabric.rendezvous judges those): backend, a peer gone, wrong sums."""
    out = []
    for host in run.hosts:
        for r in (run.ranks.get(host) or {}).get("records") or ():
            if r.get("status") == "fail" and r.get("id") != "fabric.rendezvous":
                out.append(rec(str(r.get("id")), "fail", r.get("measured"), r.get("expected"), str(r.get("unit") or ""),
                               f"{host}: {r.get('detail')}", str(r.get("fix") or "")))
    return out


def fabric_records(run: FabricRun) -> list[Record]:
    """Every record of a fabric run, figures first; a run that measured nothing ends with fabric.checked's fail."""
    run = run.as_ran()
    out = size_records(run.rank0) + [busbw_record(run), interface_record(run), rendezvous_record(run), speed_record(run),
                                     mtu_record(run), ib_record(run), peermem_record(run)]
    out += rank_failures(run) + excluded_records(run)
    checked = checked_record(run)
    return out + ([checked] if checked else [])

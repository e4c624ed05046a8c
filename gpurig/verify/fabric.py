"""The fabric proof's model, pure: the probes' documents, the interface each rank uses, and what the links promise.

checks/fabric_facts.py says what each host's network offers and
checks/fabric_allreduce.py what one rank measured; this module parses both
(``document``), works out which interface each host's rank sends over
(``chosen_link``: gpurig_fabric.interface, else NCCL's or gloo's own choice)
and what the links promise (``promise``: the typical host's interface speed,
or its InfiniBand port's rate, times ``LINK_EFFICIENCY``), with nccl-tests'
algbw and busbw. The records judged from them are gpurig/verify/fabric_checks.py;
the culprit search over pairs is gpurig/verify/culprit.py.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# NCCL over sockets or InfiniBand reaches ~90% of the line rate in nccl-tests' busbw (HDR 200 Gb/s: ~23 of 25 GB/s):
# the promise is the line rate times this; a run passes at PASS_FRACTION of the promise (100 GbE: 12.5 x 0.9 x 0.8 = 9 GB/s).
LINK_EFFICIENCY = 0.9
PASS_FRACTION = 0.8
# gloo reduces on the CPU, one thread per peer: from ~10 Gb/s links on (10 GbE itself included) it is CPU-bound, so a
# shortfall there says more of the CPUs than of the link and is a warn, not a fail; fabric.culprit then looks for a host or
# link slower than the others. A link slower than its peers still fails (fabric.speed).
GLOO_LINK_LIMIT_MBPS = 10_000
MIN_VERDICT_BYTES = 64 << 20  # below this an all-reduce is latency-bound: its busbw promises nothing about the link
VIRTUAL_PREFIXES = ("docker", "br-", "virbr", "veth", "cni", "flannel", "cali", "lo")
NCCL_DEFAULT_ORDER = ("ib", "^docker,lo,virbr", "docker", "lo")  # NCCL's ncclFindInterfaces without NCCL_SOCKET_IFNAME
FIX_INTERFACE = "set gpurig_fabric.interface to the data network's interface (it becomes NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME)"


def gbps_of_mbps(mbps: float) -> float:
    """A link's line rate in GB/s (1e9 bytes) from Mb/s: /sys/class/net/X/speed 100000 -> 12.5."""
    return mbps / 8000.0


def algbw(nbytes: int, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth, GB/s: bytes / time."""
    return nbytes / seconds / 1e9


def busbw(nbytes: int, seconds: float, world: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce, GB/s: algbw x 2(n-1)/n."""
    return algbw(nbytes, seconds) * 2 * (world - 1) / world


def document(text: str, probe: str) -> dict | None:
    """A fabric probe's JSON document (the whole output, else its last line that is one), or None."""
    for candidate in [text] + [line for line in reversed(text.splitlines()) if line.startswith("{")]:
        try:
            doc = json.loads(candidate)
        except ValueError:
            continue
        return doc if isinstance(doc, dict) and doc.get("probe") == probe else None
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def sizes(doc: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """A rank document's well-formed size entries (bytes, seconds, algbw, busbw all numbers), smallest first."""
    raw = (doc or {}).get("sizes")
    good = [dict(s) for s in raw if isinstance(s, Mapping) and all(_number(s.get(k)) for k in ("bytes", "seconds", "algbw", "busbw"))
            and s["bytes"] > 0] if isinstance(raw, list) else []
    return sorted(good, key=lambda s: s["bytes"])


def size_label(nbytes: int) -> str:
    for unit, shift in (("GB", 30), ("MB", 20), ("kB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return f"{nbytes}B"


@dataclass(frozen=True)
class Link:
    """The interface a host's rank sends over, as its facts show it; None fields were not read."""

    host: str
    name: str | None
    how: str  # why this one: "gpurig_fabric.interface", "NCCL's default order", ...
    speed_mbps: int | None = None
    mtu: int | None = None
    operstate: str | None = None
    virtual: bool = False  # not a device of its own (sysfs /virtual/): a bond, a VLAN, a veth, a bridge, loopback
    plumbing: bool = False  # a bridge, loopback, or a container network's own device (docker0, vethXXX, cni0): not a data path
    problem: str = ""  # why no usable interface was found

    @property
    def where(self) -> str:
        return f"{self.host}'s {self.name}" if self.name else self.host


@dataclass(frozen=True)
class FabricRun:
    """What the fabric level gathered: hosts in rank order, each one's facts and rank document, and the run's settings."""

    hosts: tuple[str, ...]
    facts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # host -> fabric_facts document
    ranks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # host -> fabric_allreduce document
    master: str = ""  # the rendezvous address
    port: int | None = None  # the rendezvous' TCP port (rank 0's gpurig_fabric.port)
    backend: str = "nccl"  # nccl | gloo: what the ranks were to run; as_ran() takes rank 0's word for it
    interface: str | None = None  # gpurig_fabric.interface, else NCCL_SOCKET_IFNAME
    excluded: Mapping[str, str] = field(default_factory=dict)  # host -> why its single-host verify kept it out
    interfaces: Mapping[str, str | None] = field(default_factory=dict)  # host -> its own gpurig_fabric.interface (None: unset)
    not_started: str = ""  # why the ranks were not started although the facts were read (a host with no usable interface)

    def interface_of(self, host: str) -> str | None:
        """The interface ``host``'s rank was told to use: its own setting where the run has one for it, else the run's."""
        return self.interfaces[host] if host in self.interfaces else self.interface

    @property
    def ranked(self) -> tuple[str, ...]:
        """The hosts that ran a rank, in rank order: the selected ones less those left out."""
        return tuple(h for h in self.hosts if h not in self.excluded)

    @property
    def rank0(self) -> Mapping[str, Any] | None:
        return self.ranks.get(self.ranked[0]) if self.ranked else None

    def as_ran(self) -> FabricRun:
        """This run with the backend rank 0 says it used (auto picks nccl or gloo on the hosts themselves)."""
        said = (self.rank0 or {}).get("backend")
        return replace(self, backend=said) if said in ("nccl", "gloo") and said != self.backend else self


# ---- which interface each host uses ---------------------------------------------------------------


def _matches(name: str, spec: str) -> bool:
    """NCCL_SOCKET_IFNAME's grammar: comma list of prefixes; '^' excludes them, '=' makes them exact names."""
    exclude, spec = spec.startswith("^"), spec.lstrip("^")
    exact, spec = spec.startswith("="), spec.lstrip("=")
    hit = any(name == p if exact else name.startswith(p) for p in spec.split(",") if p)
    return hit != exclude


def _usable(iface: Mapping[str, Any]) -> bool:
    """Up (or 'unknown', as lo and some drivers say) with an address NCCL would take (not IPv6 link-local)."""
    addrs = [a for a in iface.get("addresses") or () if not str(a).lower().startswith("fe80:")]
    return iface.get("operstate") in ("up", "unknown") and bool(addrs)


def default_interface(interfaces: Sequence[Mapping[str, Any]], spec: str | None) -> str | None:
    """The interface NCCL's socket transport picks: NCCL_SOCKET_IFNAME's match, else ib*, then non-docker/lo, then docker, then lo."""
    for rule in [spec] if spec else NCCL_DEFAULT_ORDER:
        for iface in interfaces:
            if _matches(str(iface.get("name")), rule) and _usable(iface):
                return str(iface["name"])
    return None


def owner_of(interfaces: Sequence[Mapping[str, Any]], address: str | None) -> str | None:
    """The interface holding ``address`` (gloo binds the one holding the host name's address)."""
    for iface in interfaces:
        for addr in iface.get("addresses") or ():
            if address and str(addr).split("/")[0] == address:
                return str(iface.get("name"))
    return None


def chosen_link(host: str, facts: Mapping[str, Any] | None, run: FabricRun) -> Link:
    """The interface this host's rank will send over, and why that one."""
    if not facts:
        return Link(host, None, "", problem="its fabric facts were not gathered")
    interfaces = list(facts.get("interfaces") or ())
    env = facts.get("env") or {}
    name: str | None
    wanted = run.interface_of(host)
    if wanted:  # NCCL_SOCKET_IFNAME's grammar: an exact name, a prefix ("eth") or an exclusion ("^docker,lo")
        name, how = default_interface(interfaces, wanted), f"gpurig_fabric.interface {wanted}"
    elif run.backend == "gloo" and env.get("GLOO_SOCKET_IFNAME"):
        name, how = str(env["GLOO_SOCKET_IFNAME"]).split(",")[0], "GLOO_SOCKET_IFNAME in the image"
    elif run.backend == "gloo":
        addr = facts.get("hostname_address")
        name, how = owner_of(interfaces, addr), f"gloo's default: the interface holding {facts.get('host') or host}'s address {addr}"
    else:
        spec = env.get("NCCL_SOCKET_IFNAME")
        name, how = default_interface(interfaces, spec), "NCCL_SOCKET_IFNAME in the image" if spec else "NCCL's default order"
    if name is None:
        return Link(host, None, how, problem=f"{host} has no usable interface by {how} (up, with an address)")
    iface = next((i for i in interfaces if _matches(str(i.get("name")), "=" + name)), None)
    if iface is None:
        return Link(host, name, how, problem=f"{host} has no interface {name}")
    plumbing = iface.get("type") == "loopback" or bool(iface.get("bridge")) or name.startswith(VIRTUAL_PREFIXES)
    return Link(host, name, how, iface.get("speed_mbps"), iface.get("mtu"), iface.get("operstate"),
                bool(iface.get("virtual")) or plumbing, plumbing)


def links(run: FabricRun) -> list[Link]:
    return [chosen_link(h, run.facts.get(h), run) for h in run.hosts if h not in run.excluded]


def missing_interfaces(run: FabricRun) -> str:
    """What the facts already show no rank can get past (a host with no usable interface, or no such one); "" when none."""
    return "; ".join(lk.problem for lk in links(run) if lk.problem and run.facts.get(lk.host))


# ---- what the links promise -----------------------------------------------------------------------


def ib_rates(facts: Mapping[str, Any] | None) -> list[float]:
    """Gb/s of each ACTIVE InfiniBand/RoCE port of a host."""
    return [float(p["rate_gbps"]) for p in (facts or {}).get("infiniband") or ()
            if p.get("state") == "ACTIVE" and isinstance(p.get("rate_gbps"), (int, float))]


def uses_ib(run: FabricRun) -> bool:
    """NCCL takes InfiniBand (or RoCE) when every host has an active port and the image does not disable it."""
    hosts = [h for h in run.hosts if h not in run.excluded]
    return (run.backend == "nccl" and bool(hosts) and all(ib_rates(run.facts.get(h)) for h in hosts)
            and not any(str((run.facts.get(h) or {}).get("env", {}).get("NCCL_IB_DISABLE")) == "1" for h in hosts))


def promise(run: FabricRun) -> tuple[float | None, str]:
    """(expected busbw GB/s, how it was worked out) from the typical host's link; (None, why) when the speeds are unknown.

    The typical (median) host, not the slowest: the promise is what the fleet was built with, so one slow
    link shows as a shortfall here and is named by fabric.speed / fabric.ib. One rank per host uses one port.
    """
    if uses_ib(run):
        best = [max(ib_rates(run.facts.get(h))) for h in run.hosts if h not in run.excluded]
        rate = statistics.median(best)
        return rate / 8 * LINK_EFFICIENCY, f"InfiniBand {rate:g} Gb/s per host x {LINK_EFFICIENCY:g}"
    speeds = [lk.speed_mbps for lk in links(run)]
    known = [s for s in speeds if s]
    if not known or len(known) < len(speeds):
        unknown = [lk.where for lk in links(run) if not lk.speed_mbps]
        return None, f"link speed not reported for {', '.join(unknown)} (virtual NICs and many cloud NICs do not say)"
    rate = statistics.median(known)
    return gbps_of_mbps(rate) * LINK_EFFICIENCY, f"{rate:g} Mb/s per host ({gbps_of_mbps(rate):g} GB/s) x {LINK_EFFICIENCY:g}"

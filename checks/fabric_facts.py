#!/usr/bin/env python3
"""What one host's network offers a training job: interfaces, the route to a peer, InfiniBand ports, GPUDirect, NVLink.

Run where the ranks run (inside the user's image, host networking, or on the
host itself) as ``python3 fabric_facts.py --json --to ADDR ...``; it prints
one JSON document and judges nothing: gpurig/verify/fabric.py turns the
documents of every host into records. Standalone on purpose (stdlib only):
the image may lack ``ip`` and ``nvidia-smi``, so every fact has a fallback
read from /proc or /sys, and a fact that cannot be read is null (unknown),
said in "unknown", never guessed. The parsers are pure functions of what the
kernel and the tools print (tests feed them recorded text); the ``read_*``
functions only gather it. Exit status 0 unless the probe itself crashes.
"""

from __future__ import annotations

import argparse
import glob
import ipaddress
import json
import os
import re
import socket
import struct
import subprocess
import sys

PROBE = "fabric_facts"
VERSION = 1
TOPO_LIMIT = 8000  # characters of `nvidia-smi topo -m` kept: a 8-GPU, 8-NIC matrix is ~3000
ARPHRD = {"1": "ether", "32": "infiniband", "772": "loopback", "65534": "none"}  # /sys/class/net/X/type
ENV_PREFIXES = ("NCCL_", "GLOO_", "MASTER_ADDR", "MASTER_PORT")
SIOCGIFADDR = 0x8915


# ---- parsers: pure ------------------------------------------------------------------------------


def parse_speed(text):
    """/sys/class/net/X/speed -> Mb/s, or None: -1 (virtual, or a VM NIC that does not say) and an unread file are unknown."""
    try:
        value = int((text or "").strip())
    except ValueError:
        return None
    return value if value > 0 else None


def parse_int(text):
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def parse_ip_addr(text):
    """`ip -o addr show` -> {interface: [address/prefix, ...]}; lo's and link-local addresses kept, as printed."""
    out = {}
    for line in text.splitlines():
        match = re.match(r"^\d+:\s+(\S+?)(?:@\S+)?\s+inet6?\s+(\S+)", line)
        if match:
            out.setdefault(match.group(1), []).append(match.group(2))
    return out


def parse_route_get(text):
    """`ip route get ADDR` -> {"dev", "src", "via", "local"}, or None when it printed no route (e.g. "Network is unreachable")."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    words = line.split()
    if "dev" not in words:
        return None
    field = {key: words[words.index(key) + 1] for key in ("dev", "src", "via") if key in words[:-1]}
    return {"dev": field.get("dev"), "src": field.get("src"), "via": field.get("via"), "local": words[0] == "local"}


def _hex_ip(word):
    return socket.inet_ntoa(struct.pack("<I", int(word, 16)))


def parse_proc_route(text):
    """/proc/net/route -> [(interface, network, prefix length, gateway or None, metric)], up routes only."""
    routes = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8 or not int(cols[3], 16) & 0x1:  # RTF_UP
            continue
        mask = _hex_ip(cols[7])
        gateway = _hex_ip(cols[2]) if int(cols[3], 16) & 0x2 else None  # RTF_GATEWAY
        prefix = ipaddress.IPv4Network(f"0.0.0.0/{mask}").prefixlen
        routes.append((cols[0], _hex_ip(cols[1]), prefix, gateway, int(cols[6])))
    return routes


def route_from_table(routes, addr):
    """The longest-prefix (then lowest-metric) route to an IPv4 ``addr``: {"dev", "via"}, or None."""
    try:
        ip = ipaddress.IPv4Address(addr)
    except ValueError:
        return None
    fitting = [r for r in routes if ip in ipaddress.IPv4Network(f"{r[1]}/{r[2]}", strict=False)]
    if not fitting:
        return None
    dev, _, _, via, _ = max(fitting, key=lambda r: (r[2], -r[4]))
    return {"dev": dev, "src": None, "via": via, "local": False}


def parse_ib_rate(text):
    """'200 Gb/sec (4X HDR)' -> 200.0 (Gb/s), or None."""
    match = re.match(r"\s*([\d.]+)\s*Gb/sec", text or "")
    return float(match.group(1)) if match else None


def parse_ib_state(text):
    """'4: ACTIVE' -> 'ACTIVE'; '5: LinkUp' -> 'LinkUp'; unread -> None."""
    text = (text or "").strip()
    return text.split(":", 1)[1].strip() if ":" in text else text or None


def peermem_loaded(modules_text):
    """Whether /proc/modules lists nvidia_peermem (or its predecessor nv_peer_mem): GPUDirect RDMA over InfiniBand."""
    return any(line.split(" ", 1)[0] in ("nvidia_peermem", "nv_peer_mem") for line in modules_text.splitlines())


def topo_nvlink(text):
    """Whether `nvidia-smi topo -m` shows NVLink between GPUs (an NV# cell; NVSwitch systems show NV18 and the like)."""
    return bool(re.search(r"\bNV\d+\b", text))


# ---- gathering ------------------------------------------------------------------------------------


def read(path):
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def run(argv, timeout=10):
    """(rc, stdout + stderr) of a command, or None when it is not installed."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout)
    except (FileNotFoundError, PermissionError):
        return None
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} did not answer in {timeout} s"
    return done.returncode, done.stdout + done.stderr


def ioctl_address(name):
    """The interface's primary IPv4 address through SIOCGIFADDR (no `ip` needed), or None."""
    try:
        import fcntl
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(packed[20:24])
    except (OSError, ImportError):
        return None


def read_interfaces(sys_net, unknown):
    listed = run(["ip", "-o", "addr", "show"])
    addresses = parse_ip_addr(listed[1]) if listed and listed[0] == 0 else None
    if addresses is None:
        unknown.append("addresses: `ip` not available, primary IPv4 addresses read through ioctl")
    out = []
    for path in sorted(glob.glob(os.path.join(sys_net, "*"))):
        name = os.path.basename(path)
        operstate = (read(os.path.join(path, "operstate")) or "").strip() or None
        if operstate is None and not os.path.exists(os.path.join(path, "mtu")):
            continue  # a link that vanished while listed (a container's veth going away)
        real = os.path.realpath(path)
        kind = ARPHRD.get((read(os.path.join(path, "type")) or "").strip(), "other")
        addrs = addresses.get(name, []) if addresses is not None else [a for a in [ioctl_address(name)] if a]
        out.append({"name": name, "index": parse_int(read(os.path.join(path, "ifindex"))), "speed_mbps": parse_speed(read(os.path.join(path, "speed"))),
                    "mtu": parse_int(read(os.path.join(path, "mtu"))), "operstate": operstate, "type": kind,
                    "virtual": "/virtual/" in real, "bridge": os.path.isdir(os.path.join(path, "bridge")),
                    "addresses": addrs})
    if not out:
        unknown.append(f"interfaces: {sys_net} lists none")
    return sorted(out, key=lambda i: (i["index"] is None, i["index"] or 0, i["name"]))  # NCCL tries them in this order


def source_address(addr):
    """The address this host sends from toward ``addr``: a UDP connect sends no packet, the kernel just picks the route."""
    try:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def read_route(addr, proc_route):
    got = run(["ip", "route", "get", addr])
    if got is not None and got[0] == 0:
        route = parse_route_get(got[1])
        if route is not None:
            return dict(route, to=addr, source="ip route get", error=None)
    if got is not None:
        return {"to": addr, "dev": None, "src": None, "via": None, "local": False, "source": "ip route get",
                "error": " ".join(got[1].split()) or f"exit {got[0]}"}
    route = route_from_table(parse_proc_route(read(proc_route) or ""), addr)
    if route is None:
        return {"to": addr, "dev": None, "src": None, "via": None, "local": False, "source": proc_route,
                "error": "no route in the table" if read(proc_route) is not None else f"{proc_route} not readable"}
    return dict(route, src=source_address(addr), to=addr, source=proc_route, error=None)


def read_infiniband(sys_ib):
    ports = []
    for port in sorted(glob.glob(os.path.join(sys_ib, "*", "ports", "*"))):
        device = port.split(os.sep)[-3]
        rate = (read(os.path.join(port, "rate")) or "").strip()
        ports.append({"device": device, "port": parse_int(os.path.basename(port)), "state": parse_ib_state(read(os.path.join(port, "state"))),
                      "phys_state": parse_ib_state(read(os.path.join(port, "phys_state"))), "rate": rate or None,
                      "rate_gbps": parse_ib_rate(rate), "link_layer": (read(os.path.join(port, "link_layer")) or "").strip() or None,
                      "netdevs": sorted(os.path.basename(p) for p in glob.glob(os.path.join(sys_ib, device, "device", "net", "*")))})
    return ports


def read_topology(unknown):
    got = run(["nvidia-smi", "topo", "-m"], timeout=20)
    if got is None:
        unknown.append("nvidia-smi topo -m: nvidia-smi not installed here")
        return None, None
    if got[0] != 0:
        unknown.append(f"nvidia-smi topo -m: exit {got[0]}: {' '.join(got[1].split())[:200]}")
        return None, None
    return got[1][:TOPO_LIMIT], topo_nvlink(got[1])


def hostname_address():
    """What this host's name resolves to: gloo binds the interface that holds it unless GLOO_SOCKET_IFNAME says otherwise."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def gather(args):
    unknown = []
    modules = read(args.proc_modules)
    if modules is None:
        unknown.append(f"nvidia_peermem: {args.proc_modules} not readable")
    topo, nvlink = read_topology(unknown) if not args.no_topo else (None, None)
    return {"probe": PROBE, "version": VERSION, "host": socket.gethostname(), "hostname_address": hostname_address(),
            "interfaces": read_interfaces(args.sys_net, unknown),
            "routes": [read_route(addr, args.proc_route) for addr in args.to],
            "infiniband": read_infiniband(args.sys_ib),
            "peermem": peermem_loaded(modules) if modules is not None else None,
            "topo": topo, "nvlink": nvlink,
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
            "unknown": unknown}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="fabric_facts.py", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the document as one JSON line (the default, and the only form)")
    parser.add_argument("--to", action="append", default=[], metavar="ADDR", help="a peer's or the rendezvous' address: the route toward it")
    parser.add_argument("--no-topo", action="store_true", help="do not run nvidia-smi topo -m")
    parser.add_argument("--sys-net", default="/sys/class/net", help="replay: sysfs's network interfaces")
    parser.add_argument("--sys-ib", default="/sys/class/infiniband", help="replay: sysfs's InfiniBand devices")
    parser.add_argument("--proc-modules", default="/proc/modules", help="replay: the loaded kernel modules")
    parser.add_argument("--proc-route", default="/proc/net/route", help="replay: the IPv4 routing table (used without `ip`)")
    args = parser.parse_args(argv)
    sys.stdout.write(json.dumps(gather(args)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fleet delivery's kit, shared by tests/integration/deploy/test_fanout.py and bench/bench_fanout.py.

- hosts: systemd hosts given Docker as the deploy tests' hosts are
  (booted from gpuhost.gpu_host_image), whose sshd also reads the login user's
  ~/.ssh/authorized_keys beside the kit's read-only file, so a peer's
  one-time key can be put there as on a real host; each with its address on
  its Docker network (their ``gpurig_delivery.address``);
- images: a few layers of random bytes made here on the fly (no host holds
  them, and they do not compress);
- the inventory a fleet deploy of one container per host reads;
- tbf on a device of this machine (this kernel has no netem): the root
  qdisc of a host's outer veth slows what the host receives, the root qdisc
  of a Docker network's bridge what this machine sends into that network
  (bridged traffic between its hosts passes no qdisc of the bridge's own);
  its counters are the bytes that went through it.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import yaml

from .conftest import DeployHost
from .fabrickit import netns
from .gpuhost import ready_host
from .test_deploy import HOST_ULIMITS

KEYS_CONF = "/etc/ssh/sshd_config.d/gpurig-test.conf"
OPEN_TO_PEERS = (f"sed -i 's|^AuthorizedKeysFile .*|AuthorizedKeysFile /etc/ssh/authorized_keys/%u .ssh/authorized_keys|' {KEYS_CONF}"
                 " && systemctl reload ssh")


def address(docker, cid: str) -> str:
    """The container's address on its (one) Docker network."""
    return docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", cid).stdout.strip()


def boot_hosts(maker, n: int, *, storage: str = "tmpfs", network: str | None = None, prepare: bool = True,
               workers: int = 4) -> list[tuple[DeployHost, str]]:
    """``n`` booted hosts with their addresses, from ``maker``'s images; ``prepare``: they are gpuhost.gpu_host_image's (made
    ready, and open to peers' keys), else the image has all it needs."""

    def boot(i: int) -> tuple[DeployHost, str]:
        host = maker.make("debian12", storage=storage, network=network)
        if prepare:
            ready_host(host)
            host.sh(OPEN_TO_PEERS)
        return DeployHost(host), address(maker.docker, host.cid)

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(boot, range(n)))


def random_layer(name: str, size: int) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        payload = os.urandom(size)
        info = tarfile.TarInfo(name)
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return data.getvalue()


# a root of this machine's sleep and its libraries, and a random payload
ROOT_SCRIPT = r"""
set -e
root=$(mktemp -d)
for bin in /usr/bin/sleep; do
    cp --parents "$bin" "$root"
    for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do cp --parents -L "$lib" "$root"; done
done
head -c "$2" /dev/urandom > "$root/payload0.bin"
tar -C "$root" -c . | docker import -c 'CMD ["/usr/bin/sleep", "infinity"]' -c "LABEL $3" - "$1" >/dev/null
rm -rf "$root"
"""


def make_image(docker, label: str, size: int, layers: int = 2) -> str:
    """An image of ``layers`` layers of random bytes (``size`` each) that runs sleep; its name."""
    ref = f"gpurig-fanout-{uuid.uuid4().hex[:8]}:1"
    base = ref.replace(":1", ":base")
    subprocess.run(["sh", "-s", "--", base, str(size), label], input=ROOT_SCRIPT, text=True, check=True, capture_output=True)
    context = io.BytesIO()
    files = {f"payload{i}.tar": random_layer(f"p{i}", size) for i in range(1, layers)}
    dockerfile = f"FROM {base}\n" + "".join(f"COPY {name} /\n" for name in files)
    with tarfile.open(fileobj=context, mode="w") as tar:
        for member, content in (("Dockerfile", dockerfile.encode()), *files.items()):
            info = tarfile.TarInfo(member)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    built = subprocess.run([docker.path, "build", "-q", "--label", label, "-t", ref, "-"], input=context.getvalue(), capture_output=True,
                           timeout=600)
    assert built.returncode == 0, built.stderr.decode()[-800:]
    docker("image", "rm", base, check=False)
    return ref


def write_inventory(path: Path, hosts: Sequence[tuple[DeployHost, str]], image: str, delivery_of: dict | None = None) -> Path:
    """fan-0, fan-1, ... in group fleet, each running one container of ``image``; ``delivery_of``: index -> gpurig_delivery
    (default: its address on the network, port 22)."""
    entries = {}
    for i, (h, addr) in enumerate(hosts):
        entries[f"fan-{i}"] = {
            "ansible_host": "127.0.0.1", "ansible_port": h.port, "ansible_user": h.user, "ansible_ssh_private_key_file": str(h.key),
            "ansible_become": True, "gpurig_delivery": (delivery_of or {}).get(i, {"address": addr, "port": 22}),
            "gpurig_containers": [{"name": "fan", "variant": "slim", "image": image, "gpus": "none",
                                   "ulimits": HOST_ULIMITS, "command": ["/usr/bin/sleep", "infinity"]}],
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"all": {"children": {"fleet": {"hosts": entries}}}}, sort_keys=False))
    return path


def local_id(docker, ref: str) -> str:
    return json.loads(docker("image", "inspect", ref).stdout)[0]["Id"]


def outer_veth(host) -> str:
    """The name, on this machine, of the other end of the host's eth0."""
    peer = re.search(r"eth0@if(\d+)", netns(host, "ip", "-o", "link", "show", "eth0").stdout)
    assert peer, "the host's eth0 has no peer on this machine"
    for line in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout.splitlines():
        index, name = line.split(":")[:2]
        if index == peer.group(1):
            return name.strip().split("@")[0]
    raise AssertionError(f"no link {peer.group(1)} on this machine")


@contextmanager
def token_bucket(device: str, rate: str) -> Iterator[Callable[[], int]]:
    """``device`` (of this machine) sends at most ``rate`` (tbf as its root qdisc); yields the bytes it sent since; removed after."""
    subprocess.run(["tc", "qdisc", "add", "dev", device, "root", "tbf", "rate", rate, "burst", "256kb", "latency", "400ms"],
                   check=True, capture_output=True)
    try:
        yield lambda: qdisc_sent(device)
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", device, "root"], capture_output=True)


def qdisc_sent(device: str) -> int:
    """The bytes ``device``'s root qdisc sent (``tc -s``); 0 where it has none."""
    shown = subprocess.run(["tc", "-s", "qdisc", "show", "dev", device], capture_output=True, text=True).stdout
    found = re.search(r"Sent (\d+) bytes", shown)
    return int(found.group(1)) if found else 0


def wait_for(condition: Callable[[], bool], what: str, proc: subprocess.Popen | None = None, deadline_s: float = 300) -> None:
    """Until ``condition()`` holds (a bounded wait; a ``proc`` that ended before fails it)."""
    end = time.monotonic() + deadline_s
    while not condition():
        assert proc is None or proc.poll() is None, f"gpurig ended before {what}: {proc.communicate()}"
        assert time.monotonic() < end, f"{what} never happened"
        time.sleep(0.1)  # polling interval while waiting for the event, not a synchronisation sleep


LEFTOVER_PROCESSES = "layer_cache.py|peer_tunnel.py|gpurig-peer-"


def peer_keys(h: DeployHost) -> list[str]:
    found = h.sh(f"cat /home/{h.user}/.ssh/authorized_keys 2>/dev/null || true").stdout
    return [line for line in found.splitlines() if "gpurig-peer-" in line]


def listening(h: DeployHost) -> set[str]:
    """The host's listening TCP sockets (address:port in /proc's hex), read from /proc: no ss or netstat needed."""
    table = h.sh("cat /proc/net/tcp /proc/net/tcp6").stdout
    return {f[1] for f in (line.split() for line in table.splitlines()[1:]) if len(f) > 3 and f[3] == "0A"}


def leftovers(hosts) -> dict[str, object]:
    """What a run must not leave on any host: peer keys, cache or tunnel processes."""
    out: dict[str, object] = {}
    for h, _ in hosts:
        procs = h.sh(f"pgrep -af '{LEFTOVER_PROCESSES}' | grep -v pgrep || true").stdout.strip()
        if peer_keys(h) or procs:
            out[h.name] = (peer_keys(h), procs)
    return out


def settle(hosts, baseline: dict[str, set[str]], deadline_s: float = 30) -> tuple[dict, dict]:
    """(leftovers, new listening sockets), once both are empty or the deadline passed (the hosts' side ends as channels close)."""
    end = time.monotonic() + deadline_s
    while True:
        left = leftovers(hosts)
        extra = {h.name: listening(h) - baseline[h.name] for h, _ in hosts}
        extra = {k: v for k, v in extra.items() if v}
        if (not left and not extra) or time.monotonic() > end:
            return left, extra
        time.sleep(0.2)  # polling interval while the hosts' processes end, not a synchronisation sleep

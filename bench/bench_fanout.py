"""Benchmark: fleet delivery (`gpurig deploy` to N hosts, the image sent into the fleet about once) against today's path (each host
pulls the whole image from the build machine), with the build machine's uplink throttled.

Run as root, with Docker and Debian's docker-registry installed:

    python bench/bench_fanout.py [--runs 1] [--hosts 8,16] [--images 200,slim] [--rate 160mbit] [--kill]

The hosts: fresh Debian 12 systemd containers (tests/integration/systemd_kit.py) on a Docker network of the bench's own. One is
given Docker by `gpurig provision --only docker,daemon,python3` (tests/integration/deploy/gpuhost.py) and its sshd opened to
peers' one-time keys (tests/integration/deploy/fanoutkit.py); it is committed without its host keys and every host is booted
from that image (each makes its own host keys at boot; its engine keeps images on a volume of its own). gpurig reaches each
over SSH on 127.0.0.1 (Docker's proxy into the network); the hosts reach each other by their addresses on it.

The uplink: tbf at ``--rate`` as the root qdisc of the network's bridge, which shapes what this machine sends into the network
(the SSH connections to every host, each host's forward to this machine's registry) and not what the hosts send each other
(bridged from port to port); measured at the start, both ways. Its counters give the bytes this machine sent into the network
in each deploy, beside gpurig's own count (``--json``'s ``fan_out`` ``sent``: bytes down the forwards from this machine).

Images (``--images``): a number is a generated image of that many MB (two layers of random bytes: no compression, no host has
them); ``slim`` is the CPU slim image the deploy tests build (tests/integration/deploy/cpuimages.py: torch 2.13.0+cpu from the
local wheelhouse; about 1.1 GB, 0.3 GB compressed). Per image, each run: a deploy to one host (the baseline), then for each N
in ``--hosts`` three deploys to the first N hosts: fan-out; today's path (``gpurig_delivery: {peer: false}`` on every host,
the inventory's own switch: no host serves, so each pulls through its own forward from this machine's registry, as a deploy
did before fan-out); fan-out with fan-1 unreachable to its peers (its ``gpurig_delivery.port`` is 9: its children go to its
parent); and the same fan-out with the uplink not throttled (the tbf's rate raised to 100gbit for that deploy): the least
time this machine takes to put the image on N hosts at all, its cores unpacking every host's copy, whatever the uplink.
A warm-up deploy first pushes the image into this machine's registry (once per image, as for a user). With ``--kill``, last:
a fan-out to the most hosts in which fan-0 (the host the build machine feeds, serving three) is killed with `docker kill` once
its children pull through it; the line says how the deploy ended and whether every other host holds the image, from where,
with no half-moved name. Everything made is removed at the end (hosts, network, images, the qdisc), also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "integration")]

from bench_deploy import bench_kit, say  # noqa: E402 - the tests' container kit, as bench_deploy makes it

MB = 1e6
# Receives one connection's bytes to the end, answers "ok"; sends N MiB to ADDR:PORT and prints the bytes a second it took.
RECEIVE = ("import socket,sys\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', "
           "int(sys.argv[1]))); s.listen(1)\nc, _ = s.accept()\nwhile c.recv(1 << 20): pass\nc.sendall(b'ok'); c.close()\n")
SEND = ("import socket,sys,time\naddr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]); end = time.monotonic() + 20\n"
        "while True:\n    try:\n        c = socket.create_connection((addr, port), timeout=5); break\n    except OSError:\n"
        "        assert time.monotonic() < end\n        time.sleep(0.05)  # polling while the receiver starts\n"
        "t = time.monotonic(); buf = bytes(1 << 20)\nfor _ in range(n): c.sendall(buf)\n"
        "c.shutdown(socket.SHUT_WR); c.recv(2); print(n * (1 << 20) / (time.monotonic() - t))\n")


class Fleet:
    """The bench's hosts on their network, the image(s), and a deploy to the first N of them."""

    def __init__(self, work: Path) -> None:
        from systemd_kit import SystemdImages, authorized_keys

        self.docker, self.kit = bench_kit()
        session = self.kit.session
        self.work, self.key = work, work / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        self.keys = authorized_keys(work / "keys", self.kit.login, self.key)
        self.images = SystemdImages(self.docker, self.kit)
        self.bridge, self.network = f"gpfan{session[-6:]}", f"gpurig-bench-fanout-{session[-7:]}"
        self.template = f"gpurig-bench-fanout-host:{session}"
        self.makers: list = []
        self.made: list[str] = []  # images of this machine to remove
        self.hosts: list = []
        self.project = work / "project"

    def boot(self, n: int) -> None:
        from deploy.cpuimages import make_project
        from deploy.fanoutkit import OPEN_TO_PEERS, boot_hosts
        from deploy.gpuhost import prepare_host
        from systemd_kit import SystemdHosts

        label = f"{self.kit.label}={self.kit.session}"
        self.docker("network", "create", "--label", label, "-o", f"com.docker.network.bridge.name={self.bridge}", self.network)
        say("hosts: one fresh Debian 12 systemd host, `gpurig provision --only docker,daemon,python3`, committed as the hosts' image ...")
        self.makers.append(SystemdHosts(self.docker, self.kit, self.images, self.keys, self.key))
        first = self.makers[0].make("debian12", storage="volume")
        prepare_host(first, self.work / "template")
        first.sh(f"{OPEN_TO_PEERS} && systemctl stop docker docker.socket && rm -f /etc/ssh/ssh_host_*")
        self.docker("commit", first.cid, self.template)
        self.made.append(self.template)
        self.makers[0].remove()
        say(f"hosts: {n} booted from it on network {self.network} (bridge {self.bridge}) ...")
        self.makers.append(SystemdHosts(self.docker, self.kit, {"debian12": self.template}, self.keys, self.key))
        self.hosts = boot_hosts(self.makers[1], n, storage="volume", network=self.network, prepare=False)
        for h, _ in self.hosts:
            self.wait_engine(h)
        make_project(self.project, f"gpurig-bench-{self.kit.session[-7:]}", "gpurig-fanout-unused:base", "/nonexistent")

    @staticmethod
    def wait_engine(h, deadline_s: float = 120) -> None:
        end = time.monotonic() + deadline_s
        while h.sh("docker info --format '{{.ServerVersion}}'", check=False).returncode != 0:
            assert time.monotonic() < end, f"dockerd in {h.name} did not answer"
            time.sleep(0.2)  # polling interval while dockerd starts, not a synchronisation sleep

    def image(self, name: str) -> str:
        from deploy.fanoutkit import make_image

        if name == "slim":
            from deploy.cpuimages import CpuImages, images_kit, make_project

            wheels = images_kit.wheel_dir()
            if not wheels:
                sys.exit(f"no torch-{images_kit.CPU_TORCH}+cpu wheel in pip's find-links")
            base, spec = self.images.base("debian12"), f"gpurig-bench-{self.kit.session[-7:]}"
            built = CpuImages(make_project(self.work / "image-project", spec, base, wheels), spec, f"{self.kit.label}={self.kit.session}",
                              base=base, wheels=wheels)
            say("image: gpurig build --variant slim --cuda cpu ...")
            try:
                return built["slim"]
            finally:
                self.made += built.built
        say(f"image: {name} MB of random layers ...")
        self.made.append(make_image(self.docker, f"{self.kit.label}={self.kit.session}", int(float(name) * MB / 2)))
        return self.made[-1]

    def speeds(self) -> tuple[float, float]:
        """Bytes a second from this machine into a host, and from one host to another (what the throttle does and does not slow)."""
        (a, a_addr), (b, _) = self.hosts[0], self.hosts[1]
        got = []
        for port, sender, mib in ((5901, [sys.executable, "-c", SEND], 40), (5902, [self.docker.path, "exec", "-i", b.cid, "python3", "-c", SEND], 400)):
            self.docker("exec", "-d", a.cid, "python3", "-c", RECEIVE, str(port))
            got.append(float(subprocess.run([*sender, a_addr, str(port), str(mib)], capture_output=True, text=True, check=True,
                                            timeout=300).stdout))
        return got[0], got[1]

    def wipe(self, count: int) -> None:
        """No container and no image on the first ``count`` hosts (and nothing a layer cache kept)."""
        script = ("docker ps -aq | xargs -r docker rm -f -v >/dev/null; docker images -aq | xargs -r docker rmi -f >/dev/null 2>&1; "
                  f"rm -rf /home/{self.kit.login}/.cache/gpurig; true")
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda h: h[0].sh(script), self.hosts[:count]))

    def deploy(self, ref: str, count: int, delivery_of: dict | None, sent_by_tc) -> dict:
        """`gpurig deploy` of ``ref`` to the first ``count`` hosts: its exit, wall, bytes out (gpurig's and tc's), sources."""
        from deploy.fanoutkit import write_inventory
        from deploy.gpuhost import gpurig

        self.wipe(count)
        inventory = write_inventory(self.project / "inventory" / "hosts.yaml", self.hosts[:count], ref, delivery_of)
        doc_path = self.project / "deploy.json"
        doc_path.unlink(missing_ok=True)
        before, started = sent_by_tc(), time.monotonic()
        proc = gpurig(self.project, "deploy", "-i", str(inventory), "--json", str(doc_path), timeout=1800,
                      env={"GPURIG_ROOT": str(self.project)})
        wall, tc = time.monotonic() - started, sent_by_tc() - before
        doc = json.loads(doc_path.read_text()) if doc_path.exists() else {}
        containers = [h["containers"][0] for h in doc.get("hosts", ()) if h.get("containers")]
        fan = (doc.get("fan_out") or [{}])[0]
        sent = fan.get("sent") if fan else sum(c.get("bytes_moved") or 0 for c in containers)
        sources = [c.get("delivery_source") or c.get("delivery") or "-" for c in containers]
        if proc.returncode != 0:
            say(f"  exit {proc.returncode}: {proc.stderr.strip()[-1500:]}")
        return {"rc": proc.returncode, "wall": wall, "sent": sent or 0, "tc": tc, "size": fan.get("size") or 0,
                "from_build": sources.count("the build machine") + sources.count("forward"), "noted": sum(1 for c in containers if c.get("delivery_note")),
                "hosts": len(containers)}

    def kill_serving(self, ref: str, count: int) -> dict:
        """The fan-out deploy to the first ``count`` hosts with fan-0 killed (`docker kill`: the whole host) once its three
        children's links into its cache are open: how the deploy ended, and what the other hosts hold and from where."""
        from deploy.fanoutkit import local_id, peer_keys, wait_for, write_inventory
        from deploy.gpuhost import gpurig

        self.wipe(count)
        inventory = write_inventory(self.project / "inventory" / "hosts.yaml", self.hosts[:count], ref)
        doc_path = self.project / "deploy.json"
        doc_path.unlink(missing_ok=True)
        first = self.hosts[0][0]
        with ThreadPoolExecutor(1) as pool:
            started = time.monotonic()
            job = pool.submit(gpurig, self.project, "deploy", "-i", str(inventory), "--json", str(doc_path), timeout=1800,
                              env={"GPURIG_ROOT": str(self.project)})
            wait_for(lambda: job.done() or len(peer_keys(first)) >= 3, "fan-0's three children linked to its cache")
            killed = time.monotonic() - started
            self.docker("kill", first.cid)
            proc = job.result()
        wall = time.monotonic() - started
        doc = json.loads(doc_path.read_text()) if doc_path.exists() else {}
        rows = {h["host"]: (h.get("containers") or [{}])[0] for h in doc.get("hosts", ())}
        want, others = local_id(self.docker, ref), self.hosts[1:count]
        names = [h.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split() for h, _ in others]
        return {"rc": proc.returncode, "wall": wall, "killed": killed, "early": job.done() and killed >= wall - 0.5,
                "holding": sum(1 for h, _ in others if h.image_id(ref) == want), "others": len(others),
                "half": sum(1 for n in names if any(x.startswith("127.0.0.1:") for x in n)),
                "from_build": sum(1 for i in range(1, count) if rows.get(f"fan-{i}", {}).get("delivery_source") == "the build machine"),
                "noted": sum(1 for i in range(1, count) if rows.get(f"fan-{i}", {}).get("delivery_note"))}

    def close(self) -> None:
        for maker in self.makers:
            maker.remove()
        self.docker("network", "rm", self.network, check=False)
        for ref in self.made:
            self.docker("image", "rm", "-f", ref, check=False)
        self.images.remove()


def scenarios(fleet: Fleet, counts: list[int]) -> list[tuple[str, int, dict | None]]:
    """(name, hosts, gpurig_delivery by index) in the order they run."""
    out: list[tuple[str, int, dict | None]] = [("one host", 1, None)]
    for n in counts:
        addresses = [a for _, a in fleet.hosts[:n]]
        out += [("fan-out", n, None), ("today (peer: false)", n, {i: {"peer": False, "address": a} for i, a in enumerate(addresses)}),
                ("fan-out, fan-1 unreachable", n, {1: {"address": addresses[1], "port": 9}}), (UNTHROTTLED, n, None)]
    return out


UNTHROTTLED = "fan-out, uplink not throttled"


@contextmanager
def rate(bridge: str, to: str, back: str) -> Iterator[None]:
    """The bridge's tbf at ``to`` for a while (its counters kept: ``tc qdisc change``), then at ``back`` again."""
    change = ["tc", "qdisc", "change", "dev", bridge, "root", "tbf", "burst", "256kb", "latency", "400ms", "rate"]
    subprocess.run([*change, to], check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run([*change, back], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--hosts", default="8,16", help="comma-separated host counts (the first N of the booted hosts)")
    parser.add_argument("--images", default="200,slim", help="comma-separated: MB of a generated image, or slim (the CPU slim image)")
    parser.add_argument("--rate", default="160mbit", help="the build machine's uplink: tbf on the bench network's bridge (tc's grammar)")
    parser.add_argument("--kill", action="store_true", help="last: a fan-out to the most hosts with fan-0 killed mid-transfer (last image)")
    args = parser.parse_args()
    counts = [int(n) for n in args.hosts.split(",")]
    if shutil.which("docker-registry") is None:
        sys.exit("docker-registry is not installed (apt-get install docker-registry)")
    from deploy.fanoutkit import token_bucket

    load = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="gpurig-bench-fanout-"))
    fleet = Fleet(work)
    printed: list[str] = []
    try:
        fleet.boot(max(counts))
        with token_bucket(fleet.bridge, args.rate) as sent_by_tc:
            into, across = fleet.speeds()
            printed.append(f"uplink: tbf {args.rate} on {fleet.bridge}; measured: this machine -> a host {into / MB:.1f} MB/s, "
                           f"host -> host {across / MB:.1f} MB/s (not throttled)")
            say(printed[-1])
            for name in args.images.split(","):
                ref = fleet.image(name)  # made when its turn comes: the first image's figures before the second is built
                say(f"{name}: warm-up deploy to one host (the image into this machine's registry) ...")
                fleet.deploy(ref, 1, None, sent_by_tc)
                results: dict[tuple[str, int], list[dict]] = {}
                for run in range(args.runs):
                    for scenario, n, delivery_of in scenarios(fleet, counts):
                        with rate(fleet.bridge, "100gbit", args.rate) if scenario == UNTHROTTLED else nullcontext():
                            got = fleet.deploy(ref, n, delivery_of, sent_by_tc)
                        results.setdefault((scenario, n), []).append(got)
                        say(f"run {run + 1}: {name} {scenario:27s} {n:2d} hosts: exit {got['rc']} {got['wall']:6.1f} s, "
                            f"{got['sent'] / MB:7.1f} MB out (tc {got['tc'] / MB:7.1f} MB), {got['from_build']} from the build machine")
                printed += table(name, fleet.docker, ref, results, args.runs)
                if args.kill and name == args.images.split(",")[-1]:  # fan-0 is gone after it: the last thing the bench does
                    say(f"{name}: fan-out to {max(counts)} hosts, fan-0 killed once its children pull through it ...")
                    got = fleet.kill_serving(ref, max(counts))
                    printed.append(f"  fan-0 killed {got['killed']:.1f} s into a fan-out to {max(counts)} hosts"
                                   f"{' (after the deploy ended: not mid-transfer)' if got['early'] else ''}: exit {got['rc']}, "
                                   f"{got['wall']:.1f} s in all; {got['holding']} of the other {got['others']} hosts hold the image "
                                   f"({got['from_build']} from the build machine, {got['noted']} saying why), {got['half']} with a "
                                   "half-moved name")
                    say(printed[-1])
                else:
                    fleet.wipe(len(fleet.hosts))  # the next image's room
    finally:
        fleet.close()
        shutil.rmtree(work, ignore_errors=True)
    print()
    print("\n".join(printed))
    print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start, "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")


def table(name: str, docker, ref: str, results: dict, runs: int) -> list[str]:
    size = next((g["size"] for rs in results.values() for g in rs if g["size"]), 0) or float(
        json.loads(docker("image", "inspect", ref).stdout)[0]["Size"])
    one = statistics.median(g["wall"] for g in results[("one host", 1)])
    one_sent = statistics.median(g["sent"] for g in results[("one host", 1)])
    lines = [f"{name} ({ref}, {size / MB:.0f} MB; one host's deploy sent {one_sent / MB:.0f} MB), median of {runs}:",
             f"  {'deploy':27s} {'hosts':>5s} {'exit':>4s} {'wall s':>7s} {'wall/1':>6s} {'out MB':>8s} {'out/size':>8s} {'out/1':>6s} "
             f"{'tc MB':>8s} {'from build':>10s} {'noted':>5s}"]
    for (scenario, n), rs in results.items():
        wall, sent = statistics.median(g["wall"] for g in rs), statistics.median(g["sent"] for g in rs)
        tc = statistics.median(g["tc"] for g in rs)
        rc = max(g["rc"] for g in rs)
        lines.append(f"  {scenario:27s} {n:5d} {rc:4d} {wall:7.1f} {wall / one:6.2f} {sent / MB:8.1f} {sent / size:8.2f} "
                     f"{sent / one_sent:6.2f} {tc / MB:8.1f} {statistics.median(g['from_build'] for g in rs):10.0f} "
                     f"{statistics.median(g['noted'] for g in rs):5.0f}")
    for (scenario, n), rs in results.items():
        if scenario == "fan-out":
            sent, wall = statistics.median(g["sent"] for g in rs) / size, statistics.median(g["wall"] for g in rs) / one
            bound = 1.5 if n <= 8 else 2.0
            lines.append(f"  targets at {n} hosts: out/size <= 1.1: {'met' if sent <= 1.1 else 'MISSED'} ({sent:.2f}); "
                         f"wall/one host <= {bound}: {'met' if wall <= bound else 'MISSED'} ({wall:.2f})")
            floor = statistics.median(g["wall"] for g in results.get((UNTHROTTLED, n), ())) if (UNTHROTTLED, n) in results else 0
            if floor:
                lines.append(f"    this machine's own floor at {n} hosts (uplink not throttled): {floor / one:.2f}x one host; "
                             f"the throttled fan-out took {wall * one / floor:.2f}x that floor")
    return lines


if __name__ == "__main__":
    main()

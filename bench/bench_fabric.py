"""Benchmark: `gpurig verify --level fabric` across three systemd hosts, clean and with each injected fault, as a table.

Run as root, with Docker:

    python bench/bench_fabric.py [--runs 1] [--rate 250mbit]

The hosts and faults are the fabric faults' tests' (tests/integration/deploy/
test_fabric_faults.py, fabrickit.py): three fresh Debian 12 systemd
containers on Docker's default bridge, each given Docker by `gpurig
provision` and its own network namespace; the CPU slim image (torch
2.13.0+cpu from the local wheelhouse) built by `gpurig build` and moved into
each host's engine; no GPU driver, so the ranks run gloo. The scenarios, each
run after the other (``--runs`` times):

- clean: nothing injected;
- tbf: ``--rate`` (tc tbf) on fab-b's eth0, sizes up to 64 MB (gpurig_fabric.max_size_mb);
- blocked port: iptables on fab-a (rank 0) dropping TCP 29500 on eth0;
- unheld address: ``gpurig_fabric.address`` 192.0.2.254 on fab-a.

Per run: the exit code, gpurig's wall time, the busbw at 256 MB and its
verdict, and every record that did not pass (status, id, what it names).
Everything made is removed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "integration")]

from bench_deploy import bench_kit, say  # noqa: E402 - the tests' container kit, as bench_deploy makes it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--rate", default="250mbit", help="the tbf rate on fab-b's eth0 (tc's grammar)")
    args = parser.parse_args()

    from deploy import fabrickit as fk
    from deploy.conftest import DeployHost
    from deploy.cpuimages import CpuImages, images_kit, make_project
    from deploy.gpuhost import prepare_host
    from systemd_kit import SystemdHosts, SystemdImages, authorized_keys

    docker, kit = bench_kit()
    work = Path(tempfile.mkdtemp(prefix="gpurig-bench-fabric-"))
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    images = SystemdImages(docker, kit)
    maker = SystemdHosts(docker, kit, images, authorized_keys(work / "keys", kit.login, key), key)
    built = None
    try:
        wheels = images_kit.wheel_dir()
        if not wheels:
            sys.exit(f"no torch-{images_kit.CPU_TORCH}+cpu wheel in pip's find-links")
        say("hosts: three fresh Debian 12 systemd hosts, `gpurig provision --only docker,daemon,python3` ...")

        def boot(i: int):
            host = maker.make("debian12", storage="volume")
            prepare_host(host, work / f"host{i}")
            return DeployHost(host)

        with ThreadPoolExecutor(3) as pool:
            hosts = list(pool.map(boot, range(3)))
        base = images.base("debian12")
        spec = f"gpurig-bench-{kit.session[-7:]}"
        built = CpuImages(make_project(work / "image-project", spec, base, wheels), spec, f"{kit.label}={kit.session}", base=base, wheels=wheels)
        say("image: gpurig build --variant slim --cuda cpu ...")
        image = built["slim"]
        say("image: into each host's engine ...")
        start = time.monotonic()
        fk.deliver(image, hosts, docker, work)
        delivered = time.monotonic() - start
        for host in hosts:
            host.set_driver(None)
        scenarios = {
            "clean": (nullcontext, None, 20),
            f"tbf {args.rate} on fab-b, to 64MB": (lambda: fk.token_bucket(hosts[1], args.rate),
                                                  {n: {"max_size_mb": fk.MAX_SIZE_MB} for n in fk.NAMES}, 20),
            "port 29500 dropped on fab-a": (lambda: fk.dropped_port(hosts[0], fk.PORT), None, 5),
            f"address {fk.UNHELD}": (nullcontext, {fk.NAMES[0]: {"address": fk.UNHELD}}, 5),
        }
        rows = []
        for run in range(args.runs):
            for name, (fault, per_host, timeout) in scenarios.items():
                project = work / f"run{run}-{len(rows)}"
                with fault():
                    got = fk.verify_fabric(hosts, image, project, per_host, timeout)
                say(fk.show(f"run {run + 1}: {name}", got))
                rows.append((name, got))
        print()
        print(f"verify --level fabric across 3 systemd hosts (gloo, CPU slim image; moved into the 3 engines in {delivered:.0f} s), "
              "one line per run:")
        print(f"  {'scenario':30s} {'exit':>4s} {'wall s':>7s} {'busbw largest':>13s}  records that did not pass")
        for name, got in rows:
            bad = [r for r in got.records.values() if r["status"] in ("fail", "warn")]
            said = "; ".join(f"{r['status']} {r['id']}" + (f" {r['measured']}" if r["id"] == "fabric.culprit" else "") for r in bad)
            busbw = got.busbw()
            shown = f"{busbw:.3f} GB/s" if busbw is not None else "-"
            print(f"  {name:30s} {got.rc:>4d} {got.seconds:7.1f} {shown:>13s}  {said or '-'}")
    finally:
        maker.remove()
        if built is not None:
            for ref in built.built:
                docker("image", "rm", ref, check=False)
        images.remove()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Benchmark: what monitoring costs. The agent's CPU, the exporter under 100 concurrent scrapes, one client watching 20 hosts.

    python bench/bench_monitor.py                 # all three (the 20-host part needs root and sshd)
    python bench/bench_monitor.py --only agent    # agent | exporter | fleet

1. Agent: checks/gpu_sampler.py at 1 and 10 samples/s, CPU time of the
   process over the sampling window (interpreter start-up excluded), side by
   side with a loop that only calls psutil for the same host figures, and
   with `nvidia-smi -l 1` / `gpustat` where they exist (not on a GPU-less
   machine: said in the output); and the agent's read of a Slurm node's job
   mapping for 8 GPUs, in process, per sample.
2. Exporter: 20 hosts x 8 GPUs of recorded samples served by gpurig's
   exporter in its own process; 100 scrapes at once, 20 rounds; latency
   percentiles and the exporter's RSS after the first and the last round.
3. Fleet: 20 loopback sshd hosts (the integration tests' SshdFarm) watched
   at 1 Hz by one client process; the client's CPU over the steady part of
   the run (after every host sent its first sample).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

AGENT = REPO / "checks" / "gpu_sampler.py"
FIXTURE = REPO / "tests" / "fixtures" / "monitor" / "runs" / "healthy" / "samples.jsonl"
PSUTIL_ONLY = """
import sys, time, psutil
interval, seconds = float(sys.argv[1]), float(sys.argv[2])
print("ready", flush=True)
due = time.monotonic()
end = due + seconds
while time.monotonic() < end:
    due += interval
    time.sleep(max(0.0, due - time.monotonic()))
    psutil.cpu_times(percpu=True); psutil.virtual_memory(); psutil.disk_io_counters(); psutil.net_io_counters(pernic=True)
"""


def window_cpu(argv: list[str], seconds: float, ready: str) -> float:
    """% of one core the process used from its first line matching ``ready`` until ``seconds`` later."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    p = psutil.Process(proc.pid)
    for line in proc.stdout:
        if ready in line:
            break
    t0, c0 = time.monotonic(), sum(p.cpu_times()[:2])
    end = t0 + seconds
    while time.monotonic() < end and proc.poll() is None:
        line = proc.stdout.readline()  # keep draining: a full pipe would stall the sampler
    c1, t1 = sum(p.cpu_times()[:2]), time.monotonic()
    proc.kill()
    proc.wait()
    return 100 * (c1 - c0) / (t1 - t0)


def bench_agent(runs: int, seconds: float) -> None:
    print(f"agent CPU, % of one core over {seconds:g}s of sampling, median of {runs} (range):")
    for rate in (1, 10):
        interval = 1 / rate
        agent = [window_cpu([sys.executable, str(AGENT), "--interval", str(interval)], seconds, '"type":"sample"') for _ in range(runs)]
        alone = [window_cpu([sys.executable, "-c", PSUTIL_ONLY, str(interval), str(seconds + 5)], seconds, "ready") for _ in range(runs)]
        print(f"  {rate:>2}/s  gpu_sampler.py {statistics.median(agent):5.2f}%  ({min(agent):.2f}-{max(agent):.2f})"
              f"   psutil alone {statistics.median(alone):5.2f}%  ({min(alone):.2f}-{max(alone):.2f})")  # fmt: skip
    for tool in ("nvidia-smi", "gpustat"):
        if shutil.which(tool) is None:
            print(f"  {tool}: not installed here (no GPU, no driver): no figure to compare")
    bench_slurm_mapping()


def bench_slurm_mapping(gpus: int = 8, rounds: int = 2000) -> None:
    """The agent's read of a Slurm node's job mapping, per sample: the GPU-less run above never reads it (no GPU record to label)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_sampler", AGENT)
    assert spec is not None and spec.loader is not None
    sampler = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sampler)
    with tempfile.TemporaryDirectory(prefix="gpurig-bench-slurm-") as tmp:
        root = Path(tmp)
        (root / "slurm-gpus").mkdir()
        (root / "slurm-jobs").mkdir()
        for i in range(gpus):
            (root / "slurm-gpus" / str(i)).write_text(f"{4200 + i}\n")
            (root / "slurm-jobs" / str(4200 + i)).write_text(f"user=user{i}\nuid={1000 + i}\n")
        print(f"Slurm job mapping, CPU per sample for {gpus} GPUs, median of 3 x {rounds} samples:")
        for what, where in (("no mapping folder (a host without Slurm)", root / "absent"), (f"a job on each of the {gpus} GPUs", root)):
            per_sample = []
            for _ in range(3):
                t0 = time.process_time()
                for _ in range(rounds):
                    sampler.add_slurm_jobs([{"index": i} for i in range(gpus)], str(where / "slurm-gpus"), str(where / "slurm-jobs"))
                per_sample.append((time.process_time() - t0) / rounds)
            us = statistics.median(per_sample) * 1e6
            print(f"  {what}: {us:.1f} us a sample, {us / 1e4:.4f}% of a core at 1/s")


EXPORTER = """
import json, sys
from gpurig.monitor.exporter import serve
from gpurig.monitor.session import Run
run = Run()
records = [json.loads(l) for l in open(sys.argv[1])]
hello = records[0]
for h in range(20):
    host = f"gpu-host-{h:02d}"
    run.add(host, {**hello, "host": host})
    for r in records[1:]:
        gpus = [dict(r["gpus"][0], index=i, uuid=f"GPU-{h:02d}-{i}") for i in range(8)]
        run.add(host, {**r, "gpus": gpus})
exporter = serve(run, "127.0.0.1", 0)
print(exporter.port, flush=True)
sys.stdin.read()
"""


def bench_exporter(rounds: int, concurrency: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", EXPORTER, str(FIXTURE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    port = int(proc.stdout.readline())
    url = f"http://127.0.0.1:{port}/metrics"
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})  # as Prometheus asks
    p = psutil.Process(proc.pid)
    latencies: list[float] = []
    rss: list[int] = []
    t = time.perf_counter()
    size = len(urllib.request.urlopen(url).read())  # the first scrape renders the page
    cold = time.perf_counter() - t
    packed = len(urllib.request.urlopen(request).read())

    async def scrape() -> float:
        # A raw asyncio client: 100 Python threads would measure the client's GIL, not the exporter.
        t = time.perf_counter()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n")
        await writer.drain()
        data = await reader.read()
        writer.close()
        assert data.startswith(b"HTTP/1.0 200") and len(data) > packed, data[:100]
        return time.perf_counter() - t

    async def round_of(n: int) -> list[float]:
        return await asyncio.gather(*(scrape() for _ in range(n)))

    try:
        for _ in range(rounds):
            latencies += asyncio.run(round_of(concurrency))
            rss.append(p.memory_info().rss)
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    q = statistics.quantiles(latencies, n=100)
    print(f"exporter: 20 hosts x 8 GPUs ({size // 1024} KiB per scrape, {packed // 1024} KiB gzipped), {concurrency} concurrent scrapes x {rounds} rounds:")
    print(f"  one scrape that renders the page (the first, or one every 5 s and more): {cold * 1000:.0f} ms")
    print(f"  latency p50 {q[49] * 1000:.0f} ms  p99 {q[98] * 1000:.0f} ms  max {max(latencies) * 1000:.0f} ms")
    print(f"  exporter RSS after round 1 {rss[0] / 2**20:.0f} MiB, after round {rounds} {rss[-1] / 2**20:.0f} MiB")


def bench_fleet(hosts: int, seconds: float) -> None:
    if os.geteuid() != 0 or shutil.which("sshd") is None and not Path("/usr/sbin/sshd").exists():
        print("fleet: skipped (needs root and openssh-server)")
        return
    from gpurig.connect.connector import Connector
    from gpurig.connect.ssh import SSHSettings
    from gpurig.inventory import Host
    from gpurig.monitor.agent import monitor_fleet
    from gpurig.monitor.session import Run
    from tests.integration.hosts.conftest import SshdFarm, keygen

    user = f"gpmb{os.getpid() % 100000}"
    work = Path(tempfile.mkdtemp(prefix="gpurig-bench-monitor-"))
    key = keygen(work / "id_ed25519")
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", "-p", "*", user], check=True)
    farm = SshdFarm(work, key.with_suffix(".pub"))
    try:
        ssh = Path(f"/home/{user}/.ssh")
        ssh.mkdir(mode=0o700)
        shutil.copy(key.with_suffix(".pub"), ssh / "authorized_keys")
        subprocess.run(["chown", "-R", f"{user}:{user}", str(ssh)], check=True)
        started = farm.start(hosts, prefix="mb")
        inv = [Host(f"mb{i:02d}", ("ungrouped",), {}, address="127.0.0.1", port=h.port, user=user, key_file=str(key)) for i, h in enumerate(started)]
        settings = SSHSettings(
            connect_timeout=10, project_known_hosts=work / "known_hosts", user_known_hosts=None, ssh_config=None,
            allow_agent=False, look_for_keys=False, host_key_policy="accept-new",
        )  # fmt: skip
        connector = Connector(settings)
        run = Run()
        window: dict[str, float] = {}

        def steady() -> None:
            while len(run.latest()) < hosts:
                time.sleep(0.05)
            window["t0"], window["c0"] = time.monotonic(), time.process_time()

        watcher = threading.Thread(target=steady, daemon=True)
        watcher.start()
        report = monitor_fleet(inv, connector, run, 1.0, seconds)
        t1, c1 = time.monotonic(), time.process_time()
        connector.close()
        cpu = 100 * (c1 - window["c0"]) / (t1 - window["t0"])
        samples = sum(len(run.series(h.name)) for h in inv)
        print(f"fleet: {hosts} loopback hosts at 1 Hz for {seconds:g}s from one client: {report.summary}, {samples} samples")
        print(f"  client CPU over the steady {t1 - window['t0']:.0f}s: {cpu:.2f}% of one core")
    finally:
        farm.stop_all()
        subprocess.run(["userdel", "-r", "-f", user], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("agent", "exporter", "fleet"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    if args.only in (None, "agent"):
        bench_agent(args.runs, args.seconds)
    if args.only in (None, "exporter"):
        for _ in range(args.runs):
            bench_exporter(20, 100)
    if args.only in (None, "fleet"):
        bench_fleet(20, max(30.0, args.seconds))


if __name__ == "__main__":
    main()

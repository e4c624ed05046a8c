"""Benchmark: what `gpurig dashboard` costs to serve 100 hosts x 8 GPUs at one sample a second (issue 39's target: < 5% of a core).

    python3 bench/bench_dashboard.py [--hosts 100] [--gpus 8] [--seconds 30] [--runs 3]

The monitor's agents are stood in for by a feeder thread that hands the
dashboard's ``Run`` one agent record per host per second, in the agent's own
JSON shape (a recorded H100 sample, tests/fixtures/monitor/runs/healthy, with
its GPU repeated), through ``Run.add`` as the monitor session does: so the
records are parsed into samples and the idle tracker hears each, exactly as
with real agents. Two phases per run, interleaved:

- monitor only: the feeder alone (what `gpurig monitor` pays in-process for
  the same records, the alternative a team has without the page);
- dashboard: the feeder, the real server (gpurig.dashboard.webserver) and one
  browser's event stream read by a separate process (its own CPU not counted):
  the page's first snapshot, then a delta every second.

Figures: this process's CPU time (user + system) over the phase, as a share
of one core; the serving cost is the difference. Also the stream's bytes per
second. Median of ``--runs``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpurig.config import Settings  # noqa: E402
from gpurig.dashboard.feeds import Feeds  # noqa: E402
from gpurig.dashboard.webauth import new_token  # noqa: E402
from gpurig.dashboard.webserver import Dashboard  # noqa: E402
from gpurig.flows.fleettask import HostOptions  # noqa: E402
from gpurig.inventory import Host  # noqa: E402

RECORDED = REPO / "tests" / "fixtures" / "monitor" / "runs" / "healthy" / "samples.jsonl"

# Reads the event stream for a while in a process of its own; prints the bytes and events it got.
READER = r"""
import http.client, sys, time
port, token, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
conn.request("GET", "/api/events", headers={"Authorization": "Bearer " + token})
answer = conn.getresponse()
assert answer.status == 200, answer.status
got = events = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    line = answer.fp.readline()
    if not line:
        break
    got += len(line)
    events += line.startswith(b"event:")
print(got, events)
"""


def templates(gpus: int) -> tuple[dict, dict]:
    """The recorded run's hello and first sample, the sample's GPU repeated ``gpus`` times (indexes, UUIDs and buses apart)."""
    records = [json.loads(line) for line in RECORDED.read_text().splitlines() if line.strip()]
    hello = next(r for r in records if r["type"] == "hello")
    sample = next(r for r in records if r["type"] == "sample")
    gpu = sample["gpus"][0]
    sample["gpus"] = [{**gpu, "index": i, "uuid": f"{gpu['uuid'][:-4]}{i:04x}", "pci_bus_id": f"00000000:{i + 7:02x}:00.0"}
                      for i in range(gpus)]
    return hello, sample


class Feeder:
    """One agent record per host per second into ``run``, until ``stop``."""

    def __init__(self, run, hosts: list[str], hello: dict, sample: dict) -> None:
        self.run, self.hosts, self.hello, self.sample = run, hosts, hello, sample
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._feed, daemon=True)

    def _feed(self) -> None:
        for host in self.hosts:
            self.run.add(host, {**self.hello, "host": host, "hostname": host})
        tick = 0
        while not self.stop.is_set():
            now = time.time()
            for host in self.hosts:
                gpus = [{**g, "util_gpu": (tick * 7 + g["index"] * 13) % 100} for g in self.sample["gpus"]]
                self.run.add(host, {**self.sample, "t": now, "host": host, "gpus": gpus})
            tick += 1
            self.stop.wait(max(0.0, 1.0 - (time.time() - now)))


def feeds_for(hosts: list[str]) -> Feeds:
    settings = Settings(root=None, inventory=Path("bench-inventory.yaml"), forks=8, connect_timeout=5.0, host_key_policy="strict",
                        known_hosts=Path(os.devnull))
    feeds = Feeds(HostOptions(settings=settings, limit=()), [Host(name, (), {}) for name in hosts], interval=1.0)
    feeds.live_state, feeds.live_why = "running", ""
    return feeds


def cpu() -> float:
    times = os.times()
    return times.user + times.system


def phase(hosts: list[str], hello: dict, sample: dict, seconds: float, serve: bool) -> tuple[float, float]:
    """(share of a core this process used, stream bytes a second) over ``seconds`` of feeding, with or without the page served."""
    feeds = feeds_for(hosts)
    feeder = Feeder(feeds.run, hosts, hello, sample)
    feeder.thread.start()
    time.sleep(2)  # a bench, not a test: two ticks of samples before measuring, so the page opens on a filled run
    dash = reader = None
    if serve:
        token = new_token()
        dash = Dashboard(feeds, token, "127.0.0.1", 0)
        dash.serve()
        reader = subprocess.Popen([sys.executable, "-c", READER, str(dash.port), token, str(seconds)], stdout=subprocess.PIPE, text=True)
    start_cpu, start = cpu(), time.monotonic()
    if reader is not None:
        out, _ = reader.communicate(timeout=seconds + 60)
        got = int(out.split()[0]) if out.strip() else 0
    else:
        time.sleep(seconds)
        got = 0
    used, took = cpu() - start_cpu, time.monotonic() - start
    feeder.stop.set()
    feeder.thread.join()
    if dash is not None:
        dash.close()
    return used / took, got / took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    hosts = [f"gpu-{i:03d}" for i in range(1, args.hosts + 1)]
    hello, sample = templates(args.gpus)
    alone, served, rates = [], [], []
    for run in range(args.runs):
        order = (False, True) if run % 2 == 0 else (True, False)
        for serve in order:
            share, rate = phase(hosts, hello, sample, args.seconds, serve)
            (served if serve else alone).append(share)
            if serve:
                rates.append(rate)
            print(f"run {run + 1}: {'dashboard' if serve else 'monitor only'}: {share * 100:.1f}% of a core"
                  + (f", stream {rate / 1000:.1f} kB/s" if serve else ""), flush=True)
    a, s = statistics.median(alone), statistics.median(served)
    print(f"\n{args.hosts} hosts x {args.gpus} GPUs at 1 Hz, {args.seconds:.0f} s a phase, median of {args.runs}:")
    print(f"  monitor only (the records parsed into the run):  {a * 100:5.1f}% of a core")
    print(f"  dashboard (the same, served to one page):        {s * 100:5.1f}% of a core  ({s / a:.2f}x)" if a else
          f"  dashboard: {s * 100:5.1f}% of a core")
    print(f"  serving alone (the difference):                  {(s - a) * 100:5.1f}% of a core  (target < 5%)")
    print(f"  event stream to the page:                        {statistics.median(rates) / 1000:5.1f} kB/s")


if __name__ == "__main__":
    main()

"""Benchmark: host-level verify of N sshd hosts on loopback (target: 20 hosts in under 10 s), beside `gpurig facts` on the same hosts.

Run as root (it starts sshd processes and a throwaway login user):

    python bench/bench_verify_hosts.py --hosts 20 --runs 3

`gpurig verify` without --container/--image runs the host probe
(checks/verify_host.py, shipped in the command line) on every host over SSH.
These hosts have no GPU: the probe finds no driver and its GPU records skip,
so the figures are verify's fleet cost (connections, shipping the probe,
Python start on the host), the floor under a GPU host's NVML queries. `gpurig
facts` on the same hosts (one round trip of shell probes) is printed beside
it: the difference is what the Python probe costs per host.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_facts import bench_args, bench_hosts, run_interleaved, write_inventories  # noqa: E402

CLI = "import sys; from gpurig.cli import main; main(sys.argv)"


def main() -> None:
    args, _, _ = bench_args(__doc__, "bench_verify_hosts.py", "gpurig")
    with bench_hosts(args.hosts, "gpurig-bench-verify-") as (work, key, hosts):
        inventory, _, _ = write_inventories(work, hosts, key)
        env = {**os.environ, "HOME": str(work), "COLUMNS": "200", "PYTHONPATH": str(REPO)}
        env.pop("SSH_AUTH_SOCK", None)
        common = ["--inventory", str(inventory), "--forks", str(args.hosts), "--host-key-policy", "strict"]
        commands = {
            "verify": [sys.executable, "-c", CLI, "verify", *common, "--json", str(work / "verify.json")],
            "facts": [sys.executable, "-c", CLI, "facts", "--full", *common, "--json", str(work / "facts.json")],
        }
        # verify exits 1 on these GPU-less hosts (host.driver fails): that is its verdict, not a failed run.
        results = run_interleaved(["verify", "facts"], commands, env, work, args.runs, Path("/nonexistent"), accept={"verify": {0, 1}})
        doc = json.loads((work / "verify.json").read_text())
        print()
        print(f"host-level verify of {len(hosts)} hosts, median of {args.runs} runs (wall, CPU of gpurig and its children, peak RSS):")
        med = {name: statistics.median(r[0] for r in rs) for name, rs in results.items()}
        for name, rs in results.items():
            print(f"  gpurig {name:7s} {med[name]:6.2f}s  cpu {statistics.median(r[1] for r in rs):6.2f}s  peak {max(r[2] for r in rs):4d} MiB")
        print(f"  verify/facts = {med['verify'] / med['facts']:.2f}x; target: verify < 10 s -> {'met' if med['verify'] < 10 else 'MISSED'}")
        print(f"  verify report: {doc.get('summary')}")


if __name__ == "__main__":
    main()

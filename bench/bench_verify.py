"""Quick verify of one host: its wall time, and where it goes (CLI start, host probe, Docker facts, container start, torch import).

    python bench/bench_verify.py --image TAG [--inventory INV --limit HOST] [--runs 5]

Without --inventory the host is this machine through a local connection (no
SSH), so the figures isolate verify's own cost; with an inventory of SSH
hosts they include the connection. The image must be on the host (a CPU
slim image from `gpurig build --variant slim --cuda cpu` will do).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = "import sys; from gpurig.cli import main; main(['gpurig', *sys.argv[1:]])"


def timed(argv: list[str], runs: int, **kw) -> tuple[float, subprocess.CompletedProcess]:
    times, proc = [], None
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, **kw)
        times.append(time.perf_counter() - start)
    return statistics.median(times), proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--inventory")
    parser.add_argument("--limit")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as tmp:
        inventory = args.inventory
        if not inventory:
            inventory = str(Path(tmp) / "hosts.yaml")
            Path(inventory).write_text("all:\n  hosts:\n    local:\n      ansible_connection: local\n")
        report = Path(tmp) / "verify.json"
        verify = [sys.executable, "-c", CLI, "verify", "-i", inventory, "--image", args.image, "--json", str(report)]
        if args.limit:
            verify += ["-l", args.limit]
        figures = {
            "gpurig CLI start (gpurig --version)": timed([sys.executable, "-c", CLI, "--version"], args.runs, env=env)[0],
            "docker run --rm (container start, no python)": timed(["docker", "run", "--rm", "--entrypoint", "true", args.image], args.runs)[0],
            "docker run --rm python3 -c 'import torch'": timed(
                ["docker", "run", "--rm", "--entrypoint", "python3", args.image, "-c", "import torch"], args.runs
            )[0],
        }
        wall, proc = timed(verify, args.runs, env=env)
        figures["gpurig verify --image (quick), whole command"] = wall
        doc = json.loads(report.read_text())
    width = max(map(len, figures)) + 2
    print(f"quick verify of one host, median of {args.runs} runs ({'SSH: ' + inventory if args.inventory else 'local connection'})")
    for name, seconds in figures.items():
        print(f"  {name:<{width}} {seconds:6.2f} s")
    for host in doc["hosts"]:
        data = host.get("data") or {}
        parts = ", ".join(f"{k} {v:.2f} s" for k, v in (data.get("seconds") or {}).items())
        print(f"  last run, {host['host']}: {host['duration_s']:.2f} s in the fleet ({parts}); verdict {data.get('worst')}")
    torch_import = figures["docker run --rm python3 -c 'import torch'"] - figures["docker run --rm (container start, no python)"]
    print(f"  torch import inside the container (difference of the two docker runs): {torch_import:.2f} s")
    sys.exit(0 if proc.returncode in (0, 1) else proc.returncode)


if __name__ == "__main__":
    main()

"""Benchmark: how long gpurig takes to start, beside importing Invoke alone (issue 23's target: within 1.4x).

    python bench/bench_startup.py                        # this tree, 7 interleaved runs of each command
    python bench/bench_startup.py --baseline 645f448     # also the code of a revision (git archive), interleaved

Each figure is one whole command as a user types it, interpreter start-up
included: `python3 -c pass`, `python3 -c 'import invoke'` (the anchor),
`gpurig --version` and `gpurig TASK --help` for the tasks people type all
day. Every command runs in a clean environment (PATH and HOME only) with
its bytecode cached, as from an installed wheel: one untimed run of each
first writes the .pyc files. Printed: the median and the range of each,
its ratio to the anchor's median, and then `-X importtime` of
`gpurig facts --help`, by package and its slowest imports, to show what
start-up still pays for.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAIN = "import sys; from gpurig.cli import main; main(sys.argv)"
TARGET = 1.4
HELP_TASKS = ("facts", "verify", "status", "logs", "build", "deploy")


def commands() -> dict[str, list[str]]:
    """name -> argv; a gpurig command runs the tree on its PYTHONPATH."""
    python = sys.executable
    cmds = {"python -c pass": [python, "-c", "pass"], "import invoke": [python, "-c", "import invoke"],
            "gpurig --version": [python, "-c", MAIN, "--version"]}
    cmds.update({f"gpurig {task} --help": [python, "-c", MAIN, task, "--help"] for task in HELP_TASKS})
    return cmds


def environment(tree: Path) -> dict[str, str]:
    # No PYTHONDONTWRITEBYTECODE: an installed wheel has its .pyc files, and so do these runs after the first.
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"), "PYTHONPATH": str(tree)}


def run_once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=tempfile.gettempdir(), capture_output=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"bench_startup: {' '.join(argv[-2:])} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[-1000:]}")
    return wall


def export_baseline(rev: str, into: Path) -> Path:
    """gpurig/ as it was at ``rev`` (git archive), to time the code before a change."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "gpurig"], check=True, capture_output=True).stdout
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def measure(trees: dict[str, Path], runs: int) -> dict[tuple[str, str], list[float]]:
    """Every command of every tree, interleaved run by run (a slow moment of the machine hits them all alike)."""
    cmds = commands()
    times: dict[tuple[str, str], list[float]] = {}
    for tree in trees.values():
        for argv in cmds.values():
            run_once(argv, environment(tree))  # writes the .pyc files
    for _ in range(runs):
        for label, tree in trees.items():
            for name, argv in cmds.items():
                if label != "now" and not name.startswith("gpurig"):
                    continue  # Python and Invoke do not depend on the tree
                times.setdefault((label, name), []).append(run_once(argv, environment(tree)))
    return times


def import_profile(tree: Path, task: str = "facts") -> tuple[Counter, list[tuple[int, str]]]:
    """(self-time µs by top-level package, the slowest imports by cumulative µs) of `gpurig TASK --help`."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", MAIN, task, "--help"], env=environment(tree),
                          capture_output=True, text=True, cwd=tempfile.gettempdir())
    by_package: Counter = Counter()
    cumulative = []
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            by_package[m[4].split(".")[0]] += int(m[1])
            cumulative.append((int(m[2]), m[4]))
    return by_package, sorted(cumulative, reverse=True)[:10]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--baseline", help="also time gpurig as it was at this git revision")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"now": REPO}
        if args.baseline:
            trees[args.baseline] = export_baseline(args.baseline, Path(tmp) / "baseline")
        times = measure(trees, args.runs)
        anchor = statistics.median(times[("now", "import invoke")])
        print(f"start-up, median of {args.runs} interleaved runs (range), ratio to importing Invoke alone; target <= {TARGET}x")
        print(f"{'command':<26} " + " ".join(f"{label:>22}" for label in trees))
        for name in commands():
            cells = []
            for label in trees:
                samples = times.get((label, name))
                if not samples:
                    cells.append(f"{'':>22}")
                    continue
                med = statistics.median(samples)
                cells.append(f"{med:6.3f} s {med / anchor:4.2f}x ({min(samples):.2f}-{max(samples):.2f})")
            print(f"{name:<26} " + " ".join(f"{c:>22}" for c in cells))
        worst = max(statistics.median(times[("now", n)]) for n in commands() if n.startswith("gpurig"))
        print(f"slowest gpurig command: {worst / anchor:.2f}x Invoke ({'met' if worst / anchor <= TARGET else 'NOT met'})")
        for label, tree in trees.items():
            by_package, slowest = import_profile(tree)
            total = sum(by_package.values())
            print(f"\n-X importtime of `gpurig facts --help` ({label}): {total / 1000:.0f} ms of imports")
            print("  by package (self time): " + ", ".join(f"{p} {us / 1000:.0f} ms" for p, us in by_package.most_common(8)))
            print("  slowest (cumulative):   " + ", ".join(f"{m} {us / 1000:.0f} ms" for us, m in slowest[:8]))


if __name__ == "__main__":
    main()

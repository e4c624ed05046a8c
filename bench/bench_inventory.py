"""Benchmark: loading and listing big inventories (5k / 10k / 20k hosts), gpurig beside ansible-inventory.

    python bench/bench_inventory.py                       # gpurig only
    python bench/bench_inventory.py --ansible .bench-venv/bin/ansible-inventory
    python bench/bench_inventory.py --baseline 4c43188 --baseline-runs 1   # also the code before issue 8

Each figure is one whole command as a user types it, interpreter start-up
included, output to a file: `invoke hosts --inventory F` (the table of every
host), `gpurig inventory --inventory F --list` (every host's resolved vars as
JSON) and, when given, `ansible-inventory -i F --list` on the same file. The
inventory: 20 groups under `all` (each with a var), every host with its own
`ansible_host`, a var on `all`; the shape of a real fleet file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_facts import timed  # noqa: E402

MAIN = "import sys; from gpurig.cli import main; main(sys.argv)"


def write_inventory(path: Path, hosts: int, groups: int = 20) -> Path:
    lines = ["all:", "  vars:", "    ansible_user: ubuntu", "  children:"]
    per = hosts // groups
    for g in range(groups):
        lines += [f"    rack{g:02d}:", "      vars:", f"        rack: {g}", "      hosts:"]
        lines += [f"        node{g:02d}-{i:05d}:\n          ansible_host: 10.{g}.{i // 250}.{i % 250 + 1}" for i in range(per)]
    path.write_text("\n".join(lines) + "\n")
    return path


def commands(inventory: Path, ansible: str | None, baseline: Path | None) -> dict[str, tuple[list[str], Path]]:
    """name -> (argv, source tree whose gpurig it runs)."""
    cmds = {
        "invoke hosts": (["invoke", "-r", "{src}", "hosts", "--inventory", str(inventory)], REPO),
        "gpurig inventory --list": ([sys.executable, "-c", MAIN, "inventory", "--inventory", str(inventory), "--list"], REPO),
    }
    if baseline is not None:
        cmds["invoke hosts (baseline)"] = (["invoke", "-r", "{src}", "hosts", "--inventory", str(inventory)], baseline)
    if ansible:
        cmds["ansible-inventory --list"] = ([str(Path(ansible).absolute()), "-i", str(inventory), "--list"], REPO)
    return cmds


def export_baseline(rev: str, into: Path) -> Path:
    """gpurig/ and tasks.py as they were at ``rev`` (git archive), to time the code before a change."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "gpurig", "tasks.py"], check=True, capture_output=True).stdout
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5000,10000,20000", help="host counts, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs per command and size; the median is shown")
    parser.add_argument("--ansible", help="path of ansible-inventory (e.g. .bench-venv/bin/ansible-inventory)")
    parser.add_argument("--baseline", help="a git revision whose gpurig to time as well (e.g. 4c43188)")
    parser.add_argument("--baseline-runs", type=int, default=1, help="runs for the baseline (it can be slow)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    with tempfile.TemporaryDirectory(prefix="gpurig-bench-inv-") as tmp:
        work = Path(tmp)
        baseline = export_baseline(args.baseline, work / "baseline") if args.baseline else None
        table: dict[str, dict[int, tuple[float, float]]] = {}
        for n in sizes:
            inventory = write_inventory(work / f"hosts-{n}.yaml", n)
            for name, (argv, src) in commands(inventory, args.ansible, baseline).items():
                ansible = str(work / "ansible")
                env = {**os.environ, "PYTHONPATH": str(src), "COLUMNS": "120", "ANSIBLE_HOME": ansible, "ANSIBLE_LOCAL_TEMP": ansible}
                runs = args.baseline_runs if src is baseline and baseline is not None else args.runs
                results = [timed([a.replace("{src}", str(src)) for a in argv], env, work) for _ in range(runs)]
                if any(r[3] != 0 for r in results):
                    sys.exit(f"{name} failed on {n} hosts (see above)")
                table.setdefault(name, {})[n] = (statistics.median(r[0] for r in results), statistics.median(r[1] for r in results))
                wall, cpu = table[name][n]
                print(f"  {name:28s} {n:6d} hosts  {wall:6.2f}s  cpu {cpu:6.2f}s", file=sys.stderr, flush=True)

    runs = f"median of {args.runs}" + (f", baseline {args.baseline_runs} run(s)" if baseline else "")
    print(f"inventory of N hosts, whole command, wall s (CPU s), {runs}:")
    print(f"  {'':28s}" + "".join(f"{n:>18,d}" for n in sizes))
    for name, row in table.items():
        print(f"  {name:28s}" + "".join(f"{row[n][0]:>10.2f} ({row[n][1]:5.2f})" for n in sizes))


if __name__ == "__main__":
    main()

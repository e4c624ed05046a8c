"""Benchmark: a fleet run over 1,000 sshd hosts on loopback: gpurig's workers per core, gpurig in one process, pyinfra, Ansible.

Run as root (it starts sshd processes and a throwaway login user):

    python bench/bench_fleet.py --hosts 1000 --runs 3 --baseline 3081bae --tools-venv /tmp/gpurig-bench-venv

Each tool runs the line ``gpurig facts`` sends (its summary probes) on every
host, at ``--forks`` connections at a time (Ansible at ``--ansible-forks``:
each of its forks is a Python process of ~60 MB), first on ``--small`` of the
hosts, then on all of them. The controller's CPU per host is the slope
between the two: (CPU at N - CPU at small) / (N - small), so the start-up
(interpreter, imports, inventory) is not counted per host; CPU is the
command's and every child it waited for (gpurig's workers, Ansible's forks;
not Ansible's ControlPersist masters, which detach). ``--baseline REV`` adds
gpurig as it was at REV (one process), interleaved. The projection to
``--project`` hosts is start-up CPU + that many times the CPU per host,
spread over the machine's cores (the hosts' own work aside).
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

from bench_facts import _stop_control_masters, ansible_ssh_env, bench_args, bench_hosts, raw, timed, write_inventories  # noqa: E402
from bench_startup import export_baseline  # noqa: E402

from gpurig.facts import SUMMARY_PROBES, facts_script  # noqa: E402

MAIN = "import sys; from gpurig.cli import main; main(sys.argv)"
TARGET_MS = 8.0


def main() -> None:
    def more(ap):
        ap.add_argument("--small", type=int, default=100, help="the smaller run the CPU per host is measured from")
        ap.add_argument("--forks", type=int, default=200)
        ap.add_argument("--ansible-forks", type=int, default=100)
        ap.add_argument("--ansible-runs", type=int, default=1, help="Ansible's runs (each takes minutes at 1,000 hosts)")
        ap.add_argument("--baseline", help="also run gpurig as it was at this git revision (one controller process)")
        ap.add_argument("--project", type=int, default=10_000)

    args, tools, venv_bin = bench_args(__doc__, "bench_fleet.py", "gpurig,pyinfra,ansible", more)
    args.hosts = max(args.hosts, args.small + 1)
    line = facts_script(SUMMARY_PROBES)
    with bench_hosts(args.hosts, "gpurig-fleet-") as (work, key, hosts):
        yaml_inv, py_inv, known = write_inventories(work, hosts, key)
        small_py = work / "pyinfra_small.py"
        exec(compile(py_inv.read_text(), str(py_inv), "exec"), scope := {})  # noqa: S102 - the inventory this bench just wrote
        small_py.write_text(f"hosts = {scope['hosts'][:args.small]!r}\n")
        env = {**os.environ, "HOME": str(work), "COLUMNS": "200"}
        env.pop("SSH_AUTH_SOCK", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        trees = {"gpurig": REPO}
        if args.baseline and "gpurig" in tools:
            trees[f"gpurig@{args.baseline}"] = export_baseline(args.baseline, work / "baseline")
        names = [h.name for h in hosts]
        commands: dict[tuple[str, int], tuple[list[str], dict[str, str]]] = {}
        for size in (args.small, args.hosts):
            limit = ["-l", ",".join(names[:size])] if size < args.hosts else []
            if "gpurig" in tools:
                for tool, tree in trees.items():
                    commands[(tool, size)] = ([sys.executable, "-c", MAIN, "facts", "-i", str(yaml_inv), "-f", str(args.forks), *limit,
                                               "--host-key-policy", "strict", "--json", str(work / f"{tool}-{size}.json")],
                                              {**env, "PYTHONPATH": str(tree)})
            if "pyinfra" in tools:
                inv = py_inv if size == args.hosts else small_py
                commands[("pyinfra", size)] = ([str(venv_bin / "pyinfra"), str(inv), "--parallel", str(args.forks), "-y", "exec", "--", line], env)
            if "ansible" in tools:
                pattern = "all" if size == args.hosts else ",".join(names[:size])
                commands[("ansible", size)] = ([str(venv_bin / "ansible"), pattern, "-i", str(yaml_inv), "-f", str(args.ansible_forks), "-o",
                                                "-m", "ansible.builtin.shell", "-a", raw(line)],
                                               {**env, **ansible_ssh_env(known), "ANSIBLE_PIPELINING": "True", "ANSIBLE_GATHERING": "explicit",
                                                "ANSIBLE_HOST_KEY_CHECKING": "True", "PATH": f"{venv_bin}:{env['PATH']}"})
        results: dict[tuple[str, int], list[tuple[float, float, int, int]]] = {k: [] for k in commands}
        for run in range(args.runs):
            for (tool, size), (argv, run_env) in commands.items():
                if tool == "ansible" and run >= args.ansible_runs:
                    continue
                if tool == "ansible":
                    run_env = {**run_env, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(work / f"cp-{run}-{size}")}
                wall, cpu, rss, rc = timed(argv, run_env, work)
                print(f"run {run + 1} {tool:18s} {size:5d} hosts {wall:7.2f}s wall {cpu:7.2f}s cpu {rss:5d} MiB exit {rc}", flush=True)
                if rc != 0:
                    sys.exit(f"{tool} failed on {size} hosts: its figures would not be comparable")
                results[(tool, size)].append((wall, cpu, rss, rc))
                if tool == "ansible":
                    _stop_control_masters(work / f"cp-{run}-{size}")
        for tool in trees if "gpurig" in tools else ():
            doc = json.loads((work / f"{tool}-{args.hosts}.json").read_text())
            if doc["summary"].get("ok", 0) != args.hosts:
                sys.exit(f"{tool}: not every host answered: {doc['summary']}")
        report(results, args, os.cpu_count() or 1)


def report(results, args, cores: int) -> None:
    tools = list(dict.fromkeys(tool for tool, _ in results))
    print(f"\nfacts (summary probes) on {args.small} and {args.hosts} sshd hosts, {cores} cores, median of up to {args.runs} runs;"
          f" CPU/host = the slope between the two sizes (target <= {TARGET_MS:.0f} ms for gpurig):")
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v), max(r[2] for r in v)) for k, v in results.items() if v}
    walls = {}
    for tool in tools:
        (w1, c1, _), (w2, c2, rss) = med[(tool, args.small)], med[(tool, args.hosts)]
        per_host = (c2 - c1) / (args.hosts - args.small)
        fixed = max(0.0, c1 - per_host * args.small)
        projected_cpu = fixed + per_host * args.project
        walls[tool] = w2
        ratio = f"  wall {w2 / walls['gpurig']:.2f}x gpurig's" if tool != "gpurig" and "gpurig" in walls else ""
        verdict = ("  ok" if per_host * 1000 <= TARGET_MS else "  over") if tool == "gpurig" else ""
        print(f"  {tool:18s} {args.small}: {w1:6.2f}s/{c1:6.2f}s cpu   {args.hosts}: {w2:6.2f}s/{c2:6.2f}s cpu  peak {rss:4d} MiB"
              f"  cpu/host {per_host * 1000:5.1f} ms{verdict}{ratio}")
        one_core = tool.startswith("gpurig@") or tool == "pyinfra"  # one controller process: one core at a time
        bound = projected_cpu if one_core else projected_cpu / cores
        print(f"  {'':18s} {args.project} hosts projected: {projected_cpu:6.1f}s of controller CPU, so >= {bound:6.1f}s wall"
              f" ({'one process, one core' if one_core else f'over {cores} cores'})")


if __name__ == "__main__":
    main()

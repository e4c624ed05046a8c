"""Benchmark: facts of one host at 100 ms RTT, gpurig beside OpenSSH running the same script (issue 23: within 1.1x).

Run as root (it starts two sshd hosts and a throwaway login user):

    python bench/bench_rtt.py --runs 5
    python bench/bench_rtt.py --runs 5 --baseline 31c6e49   # also gpurig as it was at a revision, interleaved

Both tools connect to one sshd through ``tests/integration/delayproxy.py``, which adds
the latency in user space (this kernel has no netem): a loopback path
(RTT 0), the same at ``--rtt`` (100 ms), and the same host behind a jump
host whose link has that RTT (ProxyJump; jump to host is loopback, as a
bastion beside its hosts). OpenSSH runs ``ssh -F config HOST LINE`` where
LINE is the exact line gpurig's ``facts`` sends (its pid mark, ``sh -c``
and the summary probes), with a fresh connection each run (no
ControlMaster). The round trips printed are (wall at the RTT - wall at 0)
/ RTT: each time the tool waited for an answer before going on.
Each run is one whole command, interpreter start-up included, with its
bytecode cached (one untimed round first); runs interleave, medians shown.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]

from bench_facts import BENCH_USER, bench_hosts  # noqa: E402
from bench_startup import export_baseline  # noqa: E402

from gpurig.connect.connection import to_shell  # noqa: E402
from gpurig.connect.remotegroup import marked  # noqa: E402
from gpurig.facts import SUMMARY_PROBES, facts_script  # noqa: E402
from tests.integration.delayproxy import DelayProxy  # noqa: E402

TARGET = 1.1
MAIN = "import sys; from gpurig.cli import main; main(sys.argv)"


def write_config(work: Path, key: Path, host, jump, ports: dict[str, int], rtt_ms: int) -> tuple[Path, Path]:
    """(ssh config, gpurig inventory) naming the same three ways to the host; one known_hosts for both."""
    known = work / "inventory" / "known_hosts"
    known.parent.mkdir(exist_ok=True)
    pub = {h.name: " ".join(h.host_key.with_suffix(".pub").read_text().split()[:2]) for h in (host, jump)}
    known.write_text(
        "".join(f"[127.0.0.1]:{ports[name]} {pub[host.name]}\n" for name in ("loopback", f"rtt{rtt_ms}"))
        + f"[127.0.0.1]:{host.port} {pub[host.name]}\n[127.0.0.1]:{ports['jump']} {pub[jump.name]}\n")
    config = work / "ssh_config"
    config.write_text(
        f"Host *\n  User {BENCH_USER}\n  IdentityFile {key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {known}\n"
        "  StrictHostKeyChecking yes\n  BatchMode yes\n  ControlMaster no\n  ControlPath none\n"
        + "".join(f"Host {name}\n  HostName 127.0.0.1\n  Port {ports[name]}\n" for name in ("loopback", f"rtt{rtt_ms}"))
        + f"Host jump\n  HostName 127.0.0.1\n  Port {ports['jump']}\n"
        + f"Host rtt{rtt_ms}-jump\n  HostName 127.0.0.1\n  Port {host.port}\n  ProxyJump jump\n")
    inventory = work / "inventory" / "hosts.yaml"
    inventory.write_text(
        f"all:\n  vars:\n    ansible_user: {BENCH_USER}\n    ansible_ssh_private_key_file: {key}\n  hosts:\n"
        + "".join(f"    {name}: {{ansible_host: 127.0.0.1, ansible_port: {ports[name]}}}\n" for name in ("loopback", f"rtt{rtt_ms}"))
        + f"    rtt{rtt_ms}-jump: {{ansible_host: 127.0.0.1, ansible_port: {host.port}, "
        f"ansible_ssh_common_args: '-o ProxyJump={BENCH_USER}@127.0.0.1:{ports['jump']}'}}\n")
    return config, inventory


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    """Wall seconds of one command; a failure ends the bench."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"bench_rtt: {' '.join(argv[:6])} ... exited {proc.returncode}: {(out + err).decode(errors='replace')[-1500:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rtt", type=float, default=0.1, help="round trip time in seconds (default 0.1)")
    ap.add_argument("--baseline", help="also run gpurig as it was at this git revision")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_rtt.py must run as root: it starts sshd hosts and creates a throwaway login user")
    rtt_ms = round(args.rtt * 1000)
    line = marked(to_shell(["sh", "-c", facts_script(SUMMARY_PROBES)]))
    with bench_hosts(2, "gpurig-rtt-") as (work, key, (host, jump)), ExitStack() as stack:
        proxies = {"loopback": DelayProxy(host.port, 0.0), f"rtt{rtt_ms}": DelayProxy(host.port, args.rtt),
                   "jump": DelayProxy(jump.port, args.rtt)}
        ports = {name: stack.enter_context(proxy).port for name, proxy in proxies.items()}
        config, inventory = write_config(work, key, host, jump, ports, rtt_ms)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work), "COLUMNS": "120"}
        trees = {"gpurig": REPO}
        if args.baseline:
            trees[f"gpurig@{args.baseline}"] = export_baseline(args.baseline, work / "baseline")
        scenarios = ("loopback", f"rtt{rtt_ms}", f"rtt{rtt_ms}-jump")
        commands: dict[tuple[str, str], tuple[list[str], dict[str, str]]] = {}
        for name in scenarios:
            commands[("openssh", name)] = (["ssh", "-F", str(config), name, line], env)
            for tool, tree in trees.items():
                commands[(tool, name)] = ([sys.executable, "-c", MAIN, "facts", "-i", str(inventory), "-l", name,
                                           "--host-key-policy", "strict", "--json", str(work / "facts.json")],
                                          {**env, "PYTHONPATH": str(tree)})
        for argv, run_env in commands.values():  # untimed: bytecode written, sshd warmed
            timed(argv, run_env, work)
        walls: dict[tuple[str, str], list[float]] = {k: [] for k in commands}
        for run in range(args.runs):
            for k, (argv, run_env) in commands.items():
                walls[k].append(timed(argv, run_env, work))
            print(f"run {run + 1}: " + "  ".join(f"{t}@{s} {walls[(t, s)][-1]:.3f}s" for t, s in commands), flush=True)
        facts = json.loads((work / "facts.json").read_text())
        assert facts["hosts"][0]["status"] in ("ok", "changed", "failed"), facts  # the probe ran and was read
        report(walls, scenarios, ['openssh', *trees], args.rtt, args.runs)


def report(walls: dict[tuple[str, str], list[float]], scenarios: tuple[str, ...], tools: list[str], rtt: float, runs: int) -> None:
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(f"\nfacts of one host, median of {runs} interleaved runs [range]; RT = (wall - wall at loopback) / {rtt * 1000:.0f} ms;"
          f" the ratio is to OpenSSH (target {TARGET}x at the RTT):")
    for s in scenarios:
        print(f"  {s}")
        for tool in tools:
            v = walls[(tool, s)]
            trips = "" if s == "loopback" else f"{(med[(tool, s)] - med[(tool, 'loopback')]) / rtt:5.1f} RT"
            ratio = med[(tool, s)] / med[("openssh", s)]
            verdict = "" if s == "loopback" or tool == "openssh" else ("  ok" if ratio <= TARGET else f"  over {TARGET}x")
            print(f"    {tool:22s} {med[(tool, s)]:6.3f}s [{min(v):.2f}-{max(v):.2f}] {trips:>8s} {ratio:6.2f}x{verdict}")


if __name__ == "__main__":
    main()

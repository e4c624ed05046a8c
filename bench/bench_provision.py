"""Benchmark: `gpurig provision` on hosts already provisioned (every step ok) against `gpurig facts` and an Ansible playbook.

Run as root (it starts sshd processes and a throwaway login user):

    python bench/bench_provision.py --hosts 100 --runs 3 --tools-venv /tmp/gpurig-bench-venv

The hosts are bench_facts.py's: real sshd processes on loopback, all this
machine, which is already what provision wants for a CPU host (Docker
installed and running, no GPU): every step must come back ``ok`` or
``skipped`` and nothing may change (the run fails otherwise, and gpurig
never touches /etc/docker or packages of this machine: no ``gpurig_daemon``
is set, and a step that wanted to change something would need sudo, which
the bench user lacks). The target: provision costs at most 1.5x `gpurig
facts` on the same hosts (one facts round trip per host, no changing
command). Ansible runs the same checks an idempotent provisioning playbook
needs before it can say "ok": the setup module, package_facts, and gpurig's
probe lines for what those do not cover (GPUs, driver, Docker, toolkit,
services, apt candidates).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_facts import REPO, ansible_ssh_env, bench_args, bench_hosts, run_interleaved, write_inventories  # noqa: E402

from gpurig.facts import PROBES  # noqa: E402

CHECKS = "{% raw %}" + "; ".join(f"echo @@{p.name}; ( {p.shell} ) 2>&1; echo rc=$?" for p in PROBES
                                 if p.name not in ("os_release", "uname", "nproc", "meminfo", "df")) + "{% endraw %}"


def main() -> None:
    args, tools, venv_bin = bench_args(__doc__, "bench_provision.py", "facts,provision,ansible")

    with bench_hosts(args.hosts, "gpurig-bench-prov-") as (work, key, hosts):
        yaml_inv, _, known = write_inventories(work, hosts, key)
        playbook = work / "checks.yml"
        playbook.write_text(
            "- hosts: all\n  gather_facts: true\n  tasks:\n"
            "    - name: packages\n      ansible.builtin.package_facts: {manager: apt}\n"
            f"    - name: gpu, docker, toolkit, services\n      ansible.builtin.shell: {json.dumps(CHECKS)}\n      changed_when: false\n"
        )
        env = {**os.environ, "HOME": str(work), "COLUMNS": "200", "PYTHONPATH": str(REPO)}  # this checkout, not whichever gpurig pip installed
        env.pop("SSH_AUTH_SOCK", None)
        gpurig = [sys.executable, "-c", "import sys; from gpurig.cli import main; main(sys.argv)"]
        common = ["--inventory", str(yaml_inv), "--forks", "100", "--host-key-policy", "strict"]
        commands = {
            "facts": [*gpurig, "facts", "--full", *common, "--json", str(work / "facts.json")],
            "provision": [*gpurig, "provision", *common, "--json", str(work / "provision.json")],
            "ansible": [str(venv_bin / "ansible-playbook"), "-i", str(yaml_inv), "-f", "100", str(playbook)],
        }
        results = run_interleaved(tools, commands, env, work, args.runs, venv_bin, ansible_ssh_env(known),
                                  after=lambda name: name == "provision" and _all_ok(work / "provision.json"))
        print()
        print(f"{len(hosts)} hosts already provisioned, median of {args.runs} runs (wall, CPU of the tool and its children, peak RSS):")
        med = {name: statistics.median(r[0] for r in rs) for name, rs in results.items()}
        for name, rs in results.items():
            line = f"  {name:9s} {med[name]:7.2f}s  cpu {statistics.median(r[1] for r in rs):6.2f}s  peak {max(r[2] for r in rs):4d} MiB"
            if "facts" in med and name != "facts":
                line += f"   {name}/facts = {med[name] / med['facts']:.2f}x"
            print(line)
        if "facts" in med and "provision" in med:
            ratio = med["provision"] / med["facts"]
            print(f"  target: provision <= 1.5x facts: {'met' if ratio <= 1.5 else 'MISSED'} ({ratio:.2f}x)")


def _all_ok(report: Path) -> None:
    """Every step of every host ok or skipped with nothing changed, else the figures are not of a re-run."""
    doc = json.loads(report.read_text())
    for host in doc["hosts"]:
        bad = [s for s in host["steps"] if s["status"] not in ("ok", "skipped") or s["changes"]]
        if bad or not host["steps"]:
            sys.exit(f"{host['host']}: not an already-provisioned host: {bad or host['reason']}")


if __name__ == "__main__":
    main()

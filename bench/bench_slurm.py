"""Benchmark: what gpurig's SSH fan-out costs the controller per host, against Slurm's submit and health-check paths.

Run as root (sshd hosts on loopback and a throwaway login user; Docker for the Slurm cluster's hosts):

    python3 bench/bench_slurm.py --hosts 100 --runs 3 --jobs 100 --json /tmp/bench-slurm.json

Part 1, SSH fan-out: bench_facts.py's farm of loopback sshd hosts (login user
with /bin/sh, host keys checked, strict). `gpurig exec -- true` (also at -f 16
and -f N), `gpurig verify` (host level: verify_host.py shipped in the command
line and run on each host; on these GPU-less hosts it fails, which is its
verdict, not a failed run), `gpurig facts` and `gpurig provision` (a re-run:
these hosts are this machine, every step ok, as in bench_provision.py), each
on all the hosts and on one host, at gpurig's default -f 64, runs interleaved,
medians. CPU is user+sys of the gpurig process as os.wait4 returns it for the
child: sshd and what runs on the hosts are not its children, so it is the
controller's side only. Per host: all-in (total / N) and marginal ((N hosts -
1 host) / (N - 1): gpurig's start, about 0.5 s, is a fixed cost).

Part 2, Slurm: one real cluster from tests/integration/slurm_kit.py (a
controller and two nodes: systemd containers on a network of their own with
stand-in GPUs), brought up by `gpurig provision --only docker,python3,slurm`
as tests/integration/slurm/test_slurm.py does, the health probe given the
tests' recorded outputs (SlurmHosts.replay_probe: two A100s, a clean kernel
log, through /etc/gpurig/slurm-health.args). Read through `docker exec` as
root, never through gpurig; a unit's CPU is its systemd cgroup's (cgroup v2
cpu.stat on the unified hierarchy: its processes, threads and children):

- submit: --jobs trivial `sbatch --wrap true` over one SSH session; slurmctld's
  and munged's CPU (and slurmctld's /proc/PID/stat) from before the first
  submit to the last job's jobcomp line, less their idle rates; the sbatch
  clients' CPU on the controller (bash's `times`) and the ssh client's here
  (wait4); what one `squeue --json --states=all` (gpurig's poll) costs
  slurmctld with those jobs in its memory. Then `gpurig run --scheduler
  slurm` (no --wait), --runs times, with its CPU split by phase (the fleet
  runs and lookups timed in the process), and one run with --wait.
- health: gpurig's real HealthCheckProgram (slurm_health.py running
  verify_host.py) started by hand --checks times on a node with slurmd's
  environment (only PWD and SLURMD_NODENAME), each run's CPU from wait4 (the
  probe and anything it started included); then slurmctld, munged and the
  slurmd units over --idle seconds with HealthCheckInterval=0 (no checks)
  and with HealthCheckInterval=1 (slurm.conf edited on the three hosts, then
  `scontrol reconfigure`; gpurig's own value is 60), the checks counted in
  the health program's log, slurmctld's received RPCs by type from sdiag, and
  slurmctld's log at debug level for a few seconds (who starts a check).

Part 3 prints the projection at 100, 1,000 and 10,000 nodes from these
per-host, per-job and per-check figures. Everything made is removed at the
end (sshd processes, the login user, containers, network, images, the Slurm
cgroups); the containers carry the label io.gpurig.test=bslurm<hex>.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench"), str(REPO / "tests" / "integration")]

from bench_facts import bench_hosts, write_inventories  # noqa: E402
from bench_provision import _all_ok  # noqa: E402

CLI = "import sys; from gpurig.cli import main; main(sys.argv)"  # bench_facts' form (argv[0] is -c)
CLI_ARGV = "import sys; from gpurig.cli import main; main(['gpurig', *sys.argv[1:]])"
FORKS_DEFAULT = 64  # gpurig's (gpurig/config.py DEFAULTS["forks"])
JOB_IMAGE = "gpurig-bench-slurm-job:1"
HEALTH = "/usr/local/libexec/gpurig/slurm_health.py"
HEALTH_LOG = "/var/log/slurm/gpurig-health.log"
JOBCOMP = "/var/log/slurm/jobcomp.log"
SLURM_CONF = "/etc/slurm/slurm.conf"
GPURIG_HEALTH_INTERVAL = 60  # gpurig_slurm.health_interval's default: what a provisioned cluster runs
# `gpurig run --scheduler slurm` with its phases timed in the process: process CPU (all threads) around each call below
RUN_PHASES = r"""
import json, os, sys, time
started = time.process_time()
from gpurig.cli import main, run
from gpurig.jobs import placement
from gpurig.slurm import scheduler
imported = time.process_time()
marks = []
def timed(module, name, label):
    inner = getattr(module, name)
    def wrapper(*a, **kw):
        cpu, wall = time.process_time(), time.monotonic()
        try:
            return inner(*a, **kw)
        finally:
            what = label(a) if callable(label) else label
            marks.append({"phase": what, "cpu": time.process_time() - cpu, "wall": time.monotonic() - wall})
    setattr(module, name, wrapper)
timed(scheduler, "the_cluster", "read the inventory")
timed(run, "scan", "scan the working directory")
timed(placement, "resolve_target", "resolve the image (this machine's engine asked)")
timed(scheduler, "fleet", lambda a: "fleet from {}(): {} on {} host(s)".format(sys._getframe(2).f_code.co_name, getattr(a[2], "__name__", "?"),
                                                                                len(a[1])))
def report():
    with open(os.environ["GPURIG_BENCH_PHASES"], "w") as f:
        json.dump({"start": started, "imports": imported - started, "marks": marks, "total": time.process_time()}, f)
import atexit
atexit.register(report)
main(["gpurig", *sys.argv[1:]])
"""
# gpurig's health program run by hand on a node as slurmd runs it (no environment but PWD and SLURMD_NODENAME)
BY_HAND = r"""
import json, os, subprocess, sys, time
node, count = sys.argv[1], int(sys.argv[2])
runs = []
for _ in range(count):
    t = time.monotonic()
    p = subprocess.Popen([sys.argv[3]], env={"PWD": "/", "SLURMD_NODENAME": node}, cwd="/",
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    runs.append([time.monotonic() - t, ru.ru_utime + ru.ru_stime, os.waitstatus_to_exitcode(status)])
print(json.dumps(runs))
"""


def say(text: str) -> None:
    print(text, flush=True)


def med(values) -> float:
    return statistics.median(list(values))


# ---------------------------------------------------------------- part 1: the SSH fan-out


def ssh_part(args) -> dict:
    with bench_hosts(args.hosts, "gpurig-bench-slurm-") as (work, key, hosts):
        inventory, _, _ = write_inventories(work, hosts, key)
        one = inventory.parent / "one.yaml"  # beside hosts.yaml: the same project known_hosts
        doc = yaml.safe_load(inventory.read_text())
        doc["all"]["hosts"] = {hosts[0].name: doc["all"]["hosts"][hosts[0].name]}
        one.write_text(yaml.safe_dump(doc, sort_keys=False))
        env = {**os.environ, "HOME": str(work), "COLUMNS": "200", "PYTHONPATH": str(REPO)}
        env.pop("SSH_AUTH_SOCK", None)
        env.pop("GPURIG_FORKS", None)

        def command(verb: str, inv: Path, forks: int, name: str) -> list[str]:
            tail = ["--", "true"] if verb == "exec" else []
            return [sys.executable, "-c", CLI, verb, "--inventory", str(inv), "--forks", str(forks), "--host-key-policy", "strict",
                    "--json", str(work / f"{name}.json"), *tail]

        n = len(hosts)
        plan = {  # name: (verb, inventory, forks)
            "exec": ("exec", inventory, FORKS_DEFAULT), "exec-1": ("exec", one, FORKS_DEFAULT),
            "exec-f16": ("exec", inventory, 16), f"exec-f{n}": ("exec", inventory, n),
            "verify": ("verify", inventory, FORKS_DEFAULT), "verify-1": ("verify", one, FORKS_DEFAULT),
            "facts": ("facts", inventory, FORKS_DEFAULT), "facts-1": ("facts", one, FORKS_DEFAULT),
            # these hosts are this machine, already what provision wants for a CPU host: every step ok (bench_provision.py)
            "provision": ("provision", inventory, FORKS_DEFAULT), "provision-1": ("provision", one, FORKS_DEFAULT),
        }
        commands = {name: command(verb, inv, forks, name) for name, (verb, inv, forks) in plan.items()}
        durations: dict[str, list[tuple[float, list[float]]]] = {name: [] for name in plan}

        def after(name: str) -> None:  # the fleet's own time and each host's, from gpurig's report
            doc = json.loads((work / f"{name}.json").read_text())
            hosts_doc = doc.get("hosts") or []
            durations[name].append((float(doc.get("duration_s") or 0), [float(h.get("duration_s") or 0) for h in hosts_doc]))

        say(f"\n== 1. SSH fan-out: {n} loopback sshd hosts, {args.runs} interleaved runs of each command")
        results: dict[str, list] = {name: [] for name in plan}
        for run in range(args.runs):
            for name in plan:
                proc, wall, cpu, peak = timed(commands[name], env, work)
                # verify exits 1 on these GPU-less hosts (host.driver fails): that is its verdict, not a failed run
                if proc.returncode not in ((0, 1) if plan[name][0] == "verify" else (0,)):
                    sys.exit(f"{name} failed ({proc.returncode}): {proc.stderr[-2000:]}\n{proc.stdout[-2000:]}")
                results[name].append((wall, cpu, peak))
                after(name)
                if plan[name][0] == "provision":
                    _all_ok(work / f"{name}.json")
                say(f"run {run + 1} {name:10s} {wall:6.2f} s wall {cpu:6.2f} s CPU {peak:4d} MiB peak  exit {proc.returncode}")
        out = {"hosts": n, "runs": args.runs, "commands": {}}
        for name, runs in results.items():
            verb, inv, forks = plan[name]
            out["commands"][name] = {
                "verb": verb, "hosts": 1 if inv == one else n, "forks": forks,
                "wall": med(r[0] for r in runs), "cpu": med(r[1] for r in runs), "peak_mib": max(r[2] for r in runs),
                "fleet_wall": med(d[0] for d in durations[name]),
                "host_wall_median": med(statistics.median(d[1]) for d in durations[name] if d[1]),
                "runs": [[round(r[0], 3), round(r[1], 3)] for r in runs],
            }
        return out


def ssh_table(ssh: dict) -> None:
    c, n = ssh["commands"], ssh["hosts"]
    say(f"\nSSH fan-out, {n} loopback sshd hosts, median of {ssh['runs']} interleaved runs "
        "(CPU: user+sys of the gpurig process, wait4 of the child)")
    say(f"  {'command':40s} {'forks':>5s} {'wall s':>7s} {'fleet s':>7s} {'CPU s':>6s} {'CPU ms/host':>11s} {'marginal':>9s} {'host s':>7s} {'peak':>5s}")
    labels = {"exec": "gpurig exec -- true", "verify": "gpurig verify (host probe)", "facts": "gpurig facts",
              "provision": "gpurig provision (a re-run)"}
    for _name, r in c.items():
        base = c.get(f"{r['verb']}-1")
        per = 1000 * r["cpu"] / r["hosts"]
        marginal = f"{1000 * (r['cpu'] - base['cpu']) / (r['hosts'] - 1):7.1f}ms" if base and r["hosts"] > 1 else "-"
        say(f"  {labels[r['verb']] + (' (1 host)' if r['hosts'] == 1 else ''):40s} {r['forks']:5d} {r['wall']:7.2f} {r['fleet_wall']:7.2f} "
            f"{r['cpu']:6.2f} {per:9.1f}ms {marginal:>9s} {r['host_wall_median']:7.3f} {r['peak_mib']:4d}M")


# ---------------------------------------------------------------- part 2: Slurm on a real cluster


class Cluster:
    """A provisioned Slurm cluster of tests/integration/slurm_kit.py hosts and ways to read it as root (docker exec)."""

    def __init__(self, hosts, inventory: Path, work: Path, docker) -> None:
        self.hosts, self.inventory, self.work, self.docker = hosts, inventory, work, docker
        self.controller, self.nodes = hosts.controller, hosts.nodes
        self.clk_tck = int(self.controller.sh("getconf CLK_TCK").stdout.strip() or 100)

    def pid(self, host, unit: str) -> int:
        return int(host.sh(f"systemctl show -p MainPID --value {unit}").stdout.strip())

    def unit_cpu(self, host, unit: str) -> dict[str, float]:
        """CPU seconds of ``unit`` on ``host``: "cgroup", its systemd unit's cgroup (cgroup v2 cpu.stat usage_usec on the
        unified hierarchy: every process and thread of the unit, exited ones and the programs it ran included) and
        "stat", utime+stime of its main process alone (/proc/PID/stat, clock ticks: 10 ms)."""
        pid = self.pid(host, unit)
        fields = host.sh(f"cat /proc/{pid}/stat").stdout.rsplit(")", 1)[1].split()
        ticks = (int(fields[11]) + int(fields[12])) / self.clk_tck  # utime, stime (fields 14 and 15 of proc(5))
        usage = self._unit_usage(host, pid)
        return {"stat": ticks, "cgroup": usage if usage is not None else math.nan}

    def _unit_usage(self, host, pid: int) -> float | None:
        for line in host.sh(f"cat /proc/{pid}/cgroup").stdout.splitlines():
            number, _, path = line.split(":", 2)
            if number == "0":  # the unified hierarchy (hybrid mode: mounted at /sys/fs/cgroup/unified; v2: /sys/fs/cgroup)
                for root in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
                    got = host.sh(f"cat {root}{path}/cpu.stat", check=False)
                    m = re.search(r"^usage_usec (\d+)", got.stdout, re.M) if got.returncode == 0 else None
                    if m:
                        return int(m.group(1)) / 1e6
        return None

    def container_cpu(self, host) -> float:
        """The whole host container's CPU seconds (this machine's cgroup of it: every process in it)."""
        for mount in ("cpu,cpuacct", "cpuacct"):
            path = Path(f"/sys/fs/cgroup/{mount}/docker/{host.cid}/cpuacct.usage")
            if path.exists():
                return int(path.read_text()) / 1e9
        return math.nan

    def snapshot(self) -> dict:
        snap = {"t": time.monotonic(), "slurmctld": self.unit_cpu(self.controller, "slurmctld"), "munge": self.unit_cpu(self.controller, "munge"),
                "containers": {h.name: self.container_cpu(h) for h in self.hosts.hosts}}
        snap["slurmd"] = {n.name: self.unit_cpu(n, "slurmd") for n in self.nodes}
        snap["health_lines"] = {n.name: len(self.health_runs(n)) for n in self.nodes}
        return snap

    def jobcomp_lines(self) -> int:
        got = self.controller.sh(f"wc -l < {JOBCOMP}", check=False)
        return int(got.stdout.strip() or 0) if got.returncode == 0 else 0

    def wait_jobs(self, done: int, deadline_s: float = 600) -> None:
        """Until the jobcomp file has ``done`` lines (read from the file: no RPC to slurmctld)."""
        end = time.monotonic() + deadline_s
        while self.jobcomp_lines() < done:
            if time.monotonic() > end:
                raise RuntimeError(f"jobs did not end: {self.controller.sh('squeue', check=False).stdout[-1500:]}")
            time.sleep(0.25)  # polling a file while the jobs run, not a synchronisation sleep

    def health_interval(self, seconds: int) -> None:
        """HealthCheckInterval on every host (the file must match across the cluster), then `scontrol reconfigure`."""
        for h in self.hosts.hosts:
            h.sh(f"sed -i 's/^HealthCheckInterval=.*/HealthCheckInterval={seconds}/' {SLURM_CONF}")
        self.controller.sh("scontrol reconfigure")
        end = time.monotonic() + 60
        while True:
            shown = self.controller.sh("scontrol show config").stdout
            m = re.search(r"^HealthCheckInterval\s*=\s*(\d+)", shown, re.M)
            if m and int(m.group(1)) == seconds:
                break
            if time.monotonic() > end:
                raise RuntimeError(f"HealthCheckInterval did not become {seconds}")
            time.sleep(0.5)
        self.wait_idle()

    def wait_idle(self, deadline_s: float = 120) -> None:
        end = time.monotonic() + deadline_s
        while True:
            states = self.controller.sh("sinfo -h -N -o '%T'").stdout.split()
            if states and all(s == "idle" for s in states):
                return
            if time.monotonic() > end:
                raise RuntimeError(f"nodes not idle: {self.controller.sh('sinfo -N; sinfo -R', check=False).stdout}")
            time.sleep(0.5)

    def sdiag(self) -> dict[str, int]:
        """slurmctld's RPCs received, by message type (sdiag), and its agent's counters."""
        text = self.controller.sh("sdiag").stdout
        by_type = text.split("by message type", 1)[-1].split("by user", 1)[0]
        return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s+(\w+)\s+\(\s*\d+\)\s+count:(\d+)", by_type, re.M)}

    def health_runs(self, node) -> list[str]:
        got = node.sh(f"cat {HEALTH_LOG}", check=False)
        return got.stdout.splitlines() if got.returncode == 0 else []


def delta(a: dict, b: dict) -> dict:
    return {
        "s": b["t"] - a["t"],
        "slurmctld": {k: b["slurmctld"][k] - a["slurmctld"][k] for k in a["slurmctld"]},
        "munge": {k: b["munge"][k] - a["munge"][k] for k in a["munge"]},  # munged on the controller: credentials made and checked
        "slurmd": {n: {k: b["slurmd"][n][k] - a["slurmd"][n][k] for k in a["slurmd"][n]} for n in a["slurmd"]},
        "containers": {n: b["containers"][n] - a["containers"][n] for n in a["containers"]},
    }


def cpu_of(d: dict) -> float:
    """A slurmctld/slurmd delta's figure: the cgroup's (ns resolution) where it was readable, else /proc's ticks."""
    return d["cgroup"] if not math.isnan(d["cgroup"]) else d["stat"]


@contextlib.contextmanager
def slurm_cluster(args):
    """A provisioned cluster (controller + 2 nodes), everything made removed afterwards."""
    from bench_deploy import load_root_conftest
    from slurm_kit import SlurmKit

    from gpurig.connect.engineopen import local_engine
    from gpurig.image.dockercli import find_client

    root = load_root_conftest()
    session = "bslurm" + uuid.uuid4().hex[:6]
    client = find_client()
    docker = root.Docker(client.path, local_engine())
    kit = types.SimpleNamespace(session=session, label=root.TEST_LABEL, login=root.LOGIN, mirror=root.MIRROR,
                                host=root.ContainerHost, banner=root._banner)
    from systemd_kit import SystemdImages

    work = Path(tempfile.mkdtemp(prefix="gpurig-bench-slurm-cluster-"))
    images = SystemdImages(docker, kit)
    slurm_kit = None
    try:
        key = work / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpurig-bench", "-f", str(key)], check=True)
        key.with_suffix(".pub").chmod(0o644)
        t = time.monotonic()
        say(f"\n== 2. Slurm: three fresh Debian 12 systemd hosts (label {root.TEST_LABEL}={session}) ...")
        slurm_kit = SlurmKit(docker, kit, images, key, work / "keys")
        hosts = slurm_kit.make("debian12")
        say(f"   hosts up in {time.monotonic() - t:.0f} s: {', '.join(hosts.names)}")
        inventory = hosts.write(work / "inventory" / "hosts.yaml",
                                {"gpurig_docker": {"users": [root.LOGIN]}, "gpurig_slurm": {"cluster": "bench"}})
        for node in hosts.nodes:  # gpurig's host probe cannot meet a GPU here: the health program replays recorded outputs
            hosts.replay_probe(node)
        t = time.monotonic()
        say("   gpurig provision --only docker,python3,slurm ...")
        proc, _, _ = gpurig(work, "provision", "-i", str(inventory), "--only", "docker,python3,slurm", "--json", str(work / "provision.json"))
        if proc.returncode != 0:
            raise RuntimeError(f"gpurig provision failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        say(f"   provisioned in {time.monotonic() - t:.0f} s")
        hosts.make_job_image(JOB_IMAGE)
        cluster = Cluster(hosts, inventory, work, docker)
        cluster.wait_idle()
        yield cluster
    finally:
        say("   removing the cluster's containers, network, images and Slurm cgroups ...")
        if slurm_kit is not None:
            slurm_kit.remove()
        images.remove()
        subprocess.run(["rm", "-rf", str(work)], check=False)


def gpurig(cwd: Path, *args: str, code: str | None = None, env: dict | None = None):
    """`gpurig ARGS` from ``cwd`` (HOME there: no user SSH config or agent): (CompletedProcess, wall s, CPU s of the gpurig
    process and its waited children, from os.wait4)."""
    run_env = {**os.environ, "HOME": str(cwd), "COLUMNS": "200", "PYTHONPATH": str(REPO), **(env or {})}
    run_env.pop("SSH_AUTH_SOCK", None)
    proc, wall, cpu, _ = timed([sys.executable, "-c", code or CLI_ARGV, *args], run_env, cwd)
    return proc, wall, cpu


def timed(argv: list[str], env: dict, cwd: Path):
    """(CompletedProcess, wall s, CPU s of the command and its waited children, peak RSS of the main process in MiB)."""
    out, err = cwd / "last-stdout.txt", cwd / "last-stderr.txt"
    t = time.monotonic()
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=o, stderr=e, stdin=subprocess.DEVNULL)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    wall = time.monotonic() - t
    done = subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(status), out.read_text(errors="replace"), err.read_text(errors="replace"))
    return done, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss // 1024


def ssh_timed(host, command: str) -> tuple[str, float, float]:
    """``command`` over one OpenSSH session as the sudo user: (stdout, wall s, CPU s of the ssh client here)."""
    argv = ["ssh", "-q", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes", "-i", str(host.key), "-p", str(host.port), f"{host.user}@127.0.0.1", command]
    with tempfile.TemporaryFile() as out:
        t = time.monotonic()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t
        out.seek(0)
        text = out.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"ssh {host.name} {command[:80]!r}: {text[-1500:]}")
    return text, wall, usage.ru_utime + usage.ru_stime


def bash_times(text: str) -> tuple[float, float]:
    """bash's `times`: (the shell's user+sys, its children's user+sys) in seconds."""
    found = re.findall(r"(\d+)m([\d.]+)s\s+(\d+)m([\d.]+)s", text)
    (a, b, c, d), (e, f, g, h) = found[-2], found[-1]
    return int(a) * 60 + float(b) + int(c) * 60 + float(d), int(e) * 60 + float(f) + int(g) * 60 + float(h)


def measure_idle(cl: Cluster, seconds: float, interval: int) -> dict:
    cl.health_interval(interval)
    time.sleep(3)  # let a reconfigure's own work (slurmd re-reading, a first check) pass before the window opens
    rpc0 = cl.sdiag()
    a = cl.snapshot()
    time.sleep(seconds)  # the measured window: nothing is done to the cluster in it
    b = cl.snapshot()
    rpc1 = cl.sdiag()
    runs = {n.name: cl.health_runs(n)[a["health_lines"][n.name]:b["health_lines"][n.name]] for n in cl.nodes}
    d = delta(a, b)
    d["interval"] = interval
    d["checks"] = {n: len(lines) for n, lines in runs.items()}
    d["actions"] = sorted({m.group(1) for lines in runs.values() for line in lines for m in [re.search(r"\[([^\]]*)\]", line)] if m})
    d["verdicts"] = sorted({line.split()[2] for lines in runs.values() for line in lines if len(line.split()) > 2})
    d["rpcs"] = {k: rpc1.get(k, 0) - rpc0.get(k, 0) for k in rpc1 if rpc1.get(k, 0) != rpc0.get(k, 0)}
    return d


def health_agents(cl: Cluster, seconds: float = 5) -> dict:
    """Who starts a health check: slurmctld's log at debug level for ``seconds`` (HealthCheckInterval=1 still set); it logs
    "Spawning health check agent for NODES" each time it sends REQUEST_HEALTH_CHECK to the nodes."""
    log = "/var/log/slurm/slurmctld.log"
    before = int(cl.controller.sh(f"grep -c 'health check agent' {log} || true").stdout.strip() or 0)
    cl.controller.sh("scontrol setdebug debug")
    time.sleep(seconds)  # the window in which slurmctld logs at debug level
    cl.controller.sh("scontrol setdebug info")
    lines = cl.controller.sh(f"grep 'health check agent' {log} || true").stdout.splitlines()[before:]
    return {"seconds": seconds, "agents": len(lines), "example": lines[-1] if lines else ""}


def measure_jobs(cl: Cluster, count: int, idle: dict) -> dict:
    """``count`` trivial sbatch jobs through one SSH session, plain sbatch: slurmctld's (and munged's) CPU per job."""
    done0 = cl.jobcomp_lines()
    a = cl.snapshot()
    script = f"cd /tmp && for i in $(seq {count}); do sbatch -Q -o /dev/null --wrap true || exit 1; done; times"
    out, wall, client = ssh_timed(cl.controller, f"bash -c {shlex.quote(script)}")
    submitted = time.monotonic()
    cl.wait_jobs(done0 + count)
    ended = time.monotonic()
    time.sleep(2)  # the epilogs' completion messages arrive after the jobcomp line
    b = cl.snapshot()
    shell, sbatch = bash_times(out)
    d = delta(a, b)
    ran = cl.controller.sh(f"tail -n {count} {JOBCOMP}").stdout
    per_node = {n.name: len(re.findall(rf"NodeList={re.escape(n.name)}\b", ran)) for n in cl.nodes}
    result = {"jobs": count, "submit_wall": wall, "all_done_s": ended - a["t"], "after_submit_s": ended - submitted,
              "ssh_client_cpu": client, "sbatch_cpu": sbatch, "shell_cpu": shell, "window": d, "jobs_per_node": per_node,
              "node_ms_per_job_it_ran": {n: 1000 * cpu_of(v) / max(per_node[n], 1) for n, v in d["slurmd"].items()},
              "node_container_ms_per_job": 1000 * sum(v for n, v in d["containers"].items() if n != cl.controller.name) / count}
    for unit in ("slurmctld", "munge"):
        used, idle_share = cpu_of(d[unit]), rate(idle, unit) * d["s"]
        result[unit] = {"cpu": used, "idle_share": idle_share, "ms_per_job": 1000 * (used - idle_share) / count}
    return result


def rate(window: dict, unit: str) -> float:
    """A controller unit's CPU seconds per second in an idle window."""
    return cpu_of(window[unit]) / window["s"]


def measure_polls(cl: Cluster, calls: int = 10) -> dict:
    """What one `squeue --json` (gpurig's jobs/find/--wait poll, every POLL_S while a job is followed) costs slurmctld
    with the ended jobs still in its memory (MinJobAge): the CPU of ``calls`` of them, and the bytes one returns."""
    a = cl.snapshot()
    size = 0
    for _ in range(calls):
        size = len(cl.controller.sh("squeue --json --states=all").stdout)
    b = cl.snapshot()
    d = delta(a, b)
    jobs = len(json.loads(cl.controller.sh("squeue --json --states=all").stdout).get("jobs", []))
    return {"calls": calls, "jobs_listed": jobs, "bytes": size, "slurmctld_ms_per_call": 1000 * cpu_of(d["slurmctld"]) / calls,
            "munge_ms_per_call": 1000 * cpu_of(d["munge"]) / calls}


def measure_by_hand(cl: Cluster, count: int) -> dict:
    node = cl.nodes[0]
    cl.health_interval(0)
    got = node.sh(f"python3 - {node.name} {count} {HEALTH}", input=BY_HAND)
    runs = json.loads(got.stdout.strip().splitlines()[-1])
    verdicts = cl.health_runs(node)[-count:]
    return {"node": node.name, "checks": count, "cpu_ms": [round(1000 * r[1], 1) for r in runs], "wall_ms": [round(1000 * r[0], 1) for r in runs],
            "exit": sorted({r[2] for r in runs}), "median_cpu_ms": 1000 * med(r[1] for r in runs), "median_wall_ms": 1000 * med(r[0] for r in runs),
            "last_log": verdicts[-1] if verdicts else ""}


def measure_gpurig_run(cl: Cluster, runs: int) -> dict:
    """`gpurig run --scheduler slurm -- true` (no --wait) ``runs`` times and once with --wait: client CPU and its phases."""
    job = cl.work / "job"
    job.mkdir(exist_ok=True)
    (job / "train.sh").write_text("true\n")
    phases_file = cl.work / "phases.json"
    # memlock as the tests give it: the job image's default (unlimited) is more than these hosts' containers may set
    base = ("run", "-i", str(cl.inventory), "--scheduler", "slurm", "--image", JOB_IMAGE, "--gpus", "1", "--ulimit", "memlock=8388608",
            "--workdir", str(job))
    out = {"runs": [], "wait": None}
    for i in range(runs + 1):
        wait = i == runs
        done0 = cl.jobcomp_lines()
        proc, wall, cpu = gpurig(cl.work, *base, *(("--wait",) if wait else ()), "--", "sh", "train.sh", code=RUN_PHASES,
                                       env={"GPURIG_BENCH_PHASES": str(phases_file)})
        if proc.returncode != 0:
            raise RuntimeError(f"gpurig run failed ({proc.returncode}): {proc.stderr[-2000:]}")
        phases = json.loads(phases_file.read_text())
        cl.wait_jobs(done0 + 1)
        entry = {"wall": wall, "cpu": cpu, "phases": phases}
        if wait:
            out["wait"] = entry
        else:
            out["runs"].append(entry)
        say(f"   gpurig run --scheduler slurm{' --wait' if wait else ''}: {wall:.2f} s wall, {cpu:.3f} s CPU")
    return out


def slurm_part(args) -> dict:
    with slurm_cluster(args) as cl:
        shown = cl.controller.sh("scontrol show config").stdout
        config = {k: (re.search(rf"^{k}\s*=\s*(.*)$", shown, re.M) or [None, ""])[1].strip()
                  for k in ("SlurmdTimeout", "TreeWidth", "MessageTimeout", "HealthCheckNodeState", "SchedulerParameters", "SelectType")}
        out: dict = {"nodes": len(cl.nodes), "version": cl.controller.sh("sinfo -V").stdout.strip(), "config": config,
                     "gpurig_health_interval": GPURIG_HEALTH_INTERVAL}
        say(f"   {out['version']}; slurmctld and slurmd as systemd units (their cgroups' cpuacct read on the hosts)")
        say(f"   idle, HealthCheckInterval=0 (no health checks), {args.idle} s ...")
        out["idle_off"] = measure_idle(cl, args.idle, 0)
        say(f"   {args.jobs} x sbatch --wrap true over one SSH session ...")
        out["jobs"] = measure_jobs(cl, args.jobs, out["idle_off"])
        out["polls"] = measure_polls(cl)
        say(f"   gpurig's health program by hand on {cl.nodes[0].name}, {args.checks} runs ...")
        out["by_hand"] = measure_by_hand(cl, args.checks)
        say(f"   idle, HealthCheckInterval=1 (a check a second on each node), {args.idle} s ...")
        out["idle_hc1"] = measure_idle(cl, args.idle, 1)
        out["agent_evidence"] = health_agents(cl)
        cl.health_interval(GPURIG_HEALTH_INTERVAL)
        say(f"   gpurig run --scheduler slurm, {args.runs} runs and one with --wait ...")
        out["gpurig_run"] = measure_gpurig_run(cl, args.runs)
        return out


def slurm_table(sl: dict) -> None:
    j, bh, off, on = sl["jobs"], sl["by_hand"], sl["idle_off"], sl["idle_hc1"]
    nodes = list(on["checks"])
    say(f"\nSlurm ({sl['version']}), a controller and {sl['nodes']} slurmd nodes (systemd containers on this machine), "
        f"config: {', '.join(f'{k}={v}' for k, v in sl['config'].items())}")
    say(f"  submit: {j['jobs']} x sbatch --wrap true over one SSH session: submitted in {j['submit_wall']:.2f} s, all ended "
        f"{j['all_done_s']:.1f} s after the first")
    for unit in ("slurmctld", "munge"):
        u = j[unit]
        stat = f"   (/proc/PID/stat: {1000 * j['window'][unit]['stat']:.0f} ms)" if unit == "slurmctld" else ""
        say(f"    {unit + (' (munged)' if unit == 'munge' else ''):17s} {1000 * u['cpu']:7.0f} ms in the window ({1000 * u['idle_share']:.0f} ms of it "
            f"its idle rate) -> {u['ms_per_job']:.2f} ms/job" + stat)
    say(f"    sbatch clients    {1000 * j['sbatch_cpu']:7.0f} ms on the controller host -> {1000 * j['sbatch_cpu'] / j['jobs']:.2f} ms/job; "
        f"the ssh client here {1000 * j['ssh_client_cpu']:.0f} ms for the one session")
    per_node = ", ".join(f"{v:.1f} ({j['jobs_per_node'][n]} jobs)" for n, v in j["node_ms_per_job_it_ran"].items())
    say(f"    on the nodes      slurmd's unit (slurmd, slurmstepd, prolog, epilog, the job) {per_node} ms per job it ran; "
        f"whole node containers {j['node_container_ms_per_job']:.1f} ms/job")
    p = sl.get("polls")
    if p:
        say(f"  a poll (squeue --json --states=all, as gpurig jobs/--wait read the queue) with {p['jobs_listed']} ended jobs in memory: "
            f"slurmctld {p['slurmctld_ms_per_call']:.1f} ms + munged {p['munge_ms_per_call']:.1f} ms, {p['bytes'] / 1e3:.0f} kB")
    runs = sl["gpurig_run"]["runs"]
    say(f"  gpurig run --scheduler slurm -- sh train.sh (one job, no --wait), median of {len(runs)}: "
        f"{med(r['wall'] for r in runs):.2f} s wall, {1000 * med(r['cpu'] for r in runs):.0f} ms CPU (wait4), made of:")
    for label, value in run_phases(runs).items():
        say(f"    {label:60s} {1000 * value:7.1f} ms")
    w = sl["gpurig_run"]["wait"]
    calls = [m["phase"] for m in w["phases"]["marks"] if m["phase"].startswith("fleet")]
    say(f"  the same with --wait: {w['wall']:.2f} s wall, {1000 * w['cpu']:.0f} ms CPU, {len(calls)} fleet runs (each a new SSH connection per host): "
        + "; ".join(calls))
    say(f"  health: gpurig's HealthCheckProgram by hand on {bh['node']} ({bh['checks']} runs, slurmd's environment): "
        f"{bh['median_cpu_ms']:.1f} ms CPU, {bh['median_wall_ms']:.0f} ms wall per check (median; exit {bh['exit']})")
    ev = sl.get("agent_evidence")
    if ev:
        say(f"    who starts a check: slurmctld at debug level for {ev['seconds']:.0f} s logged {ev['agents']} x "
            f"\"{ev['example'].split('debug:', 1)[-1].strip()}\" (REQUEST_HEALTH_CHECK, one RPC a node a check)")
    for d, what in ((off, "HealthCheckInterval=0 (no checks)"), (on, "HealthCheckInterval=1")):
        checks = sum(d["checks"].values())
        say(f"    {what:34s} {d['s']:5.1f} s: slurmctld {1000 * cpu_of(d['slurmctld']):6.1f} ms, munged {1000 * cpu_of(d['munge']):5.1f} ms; slurmd units "
            + ", ".join(f"{1000 * cpu_of(d['slurmd'][n]):.0f}" for n in nodes) + " ms; checks "
            + ", ".join(str(d["checks"][n]) for n in nodes) + f"; actions {d['actions'] or '-'}; RPCs to slurmctld {d['rpcs'] or '-'}")
        if checks:
            say(f"      -> per check: on the node {1000 * sum(cpu_of(d['slurmd'][n]) for n in nodes) / checks:.1f} ms (slurmd's unit), "
                f"on the controller slurmctld {health_ctld_ms(sl):.2f} ms + munged {health_ctld_ms(sl, 'munge'):.2f} ms (less their rates with no checks)")


def run_phases(runs: list) -> dict[str, float]:
    """Median CPU seconds per phase of `gpurig run --scheduler slurm`."""
    phases: dict[str, list[float]] = {}
    for r in runs:
        p = r["phases"]
        marked = {"interpreter start": p["start"], "imports (gpurig.cli and what it pulls in)": p["imports"]}
        for m in p["marks"]:
            marked[m["phase"]] = marked.get(m["phase"], 0) + m["cpu"]
        marked["the rest (options, the batch script, output, exit)"] = r["cpu"] - sum(marked.values())
        for k, v in marked.items():
            phases.setdefault(k, []).append(v)
    return {k: med(v) for k, v in phases.items()}


def health_ctld_ms(sl: dict, unit: str = "slurmctld") -> float:
    """A controller unit's CPU per node-check: the HealthCheckInterval=1 window less the rate with no checks, over the checks."""
    off, on = sl["idle_off"], sl["idle_hc1"]
    extra = cpu_of(on[unit]) - rate(off, unit) * on["s"]
    return 1000 * max(extra, 0.0) / max(sum(on["checks"].values()), 1)


# ---------------------------------------------------------------- part 3: on paper


def model(ssh: dict, sl: dict | None) -> dict:
    """The per-host, per-job and per-check figures the projection is made from."""
    c = ssh["commands"]
    per = {}
    for verb in ("exec", "verify", "facts", "provision"):
        if verb not in c:
            continue
        many, one = c[verb], c[f"{verb}-1"]
        m = (many["cpu"] - one["cpu"]) / (many["hosts"] - 1)
        per[verb] = {"marginal_s": m, "fixed_cpu_s": one["cpu"] - m, "fixed_wall_s": one["wall"] - one["fleet_wall"],
                     "host_s": one["host_wall_median"], "measured_wall": many["wall"], "measured_cpu": many["cpu"]}
    out = {"ssh": per, "hosts": ssh["hosts"]}
    if sl:
        runs = sl["gpurig_run"]["runs"]
        phases = run_phases(runs)
        prepare = next(v for k, v in phases.items() if ": prepare on " in k)
        out["slurm"] = {
            "job_ctld_s": (sl["jobs"]["slurmctld"]["ms_per_job"] + sl["jobs"]["munge"]["ms_per_job"]) / 1000,
            "job_sbatch_s": sl["jobs"]["sbatch_cpu"] / sl["jobs"]["jobs"],
            "check_ctld_s": (health_ctld_ms(sl) + health_ctld_ms(sl, "munge")) / 1000, "check_node_s": sl["by_hand"]["median_cpu_ms"] / 1000,
            "run_cpu_s": med(r["cpu"] for r in runs), "run_prepare_per_node_s": prepare / sl["nodes"], "nodes": sl["nodes"],
            "idle_ctld_rate": rate(sl["idle_off"], "slurmctld") + rate(sl["idle_off"], "munge"),
            "poll_s": (sl["polls"]["slurmctld_ms_per_call"] + sl["polls"]["munge_ms_per_call"]) / 1000 if "polls" in sl else math.nan,
        }
    return out


def ssh_wall(p: dict, n: int, forks: int) -> float:
    """One fleet-wide SSH operation's wall on ``n`` hosts: the fixed start plus the larger of the fork-bound time (waves of
    ``forks`` hosts, each host's own time) and the CPU-bound time (one Python process: about one core of it at a time)."""
    return p["fixed_wall_s"] + max(math.ceil(n / forks) * p["host_s"], n * p["marginal_s"])


def projection(mo: dict, jobs: int = 1000, interval: int = GPURIG_HEALTH_INTERVAL) -> list[tuple]:
    rows = []
    s, sl = mo["ssh"], mo.get("slurm")
    for n in (100, 1000, 10000):
        row = {"n": n}
        for verb in [v for v in ("provision", "facts", "verify", "exec") if v in s]:
            p = s[verb]
            row[verb] = (p["fixed_cpu_s"] + n * p["marginal_s"], ssh_wall(p, n, FORKS_DEFAULT))
        v = s["verify"]
        row["ssh_health_hour"] = (3600 / interval) * (v["fixed_cpu_s"] + n * v["marginal_s"])  # verify every interval, by SSH
        row["ssh_health_pass"] = ssh_wall(v, n, FORKS_DEFAULT)
        if sl:
            row["slurm_health_hour"] = (3600 / interval) * n * sl["check_ctld_s"]
            row["slurm_jobs"] = jobs * sl["job_ctld_s"], jobs * sl["job_sbatch_s"]
            fixed = sl["run_cpu_s"] - sl["nodes"] * sl["run_prepare_per_node_s"]
            row["gpurig_run"] = fixed + n * sl["run_prepare_per_node_s"]
        rows.append(row)
    return rows


def projection_table(mo: dict, jobs: int = 1000, interval: int = GPURIG_HEALTH_INTERVAL) -> None:
    rows = projection(mo, jobs, interval)
    say(f"\nProjection: the controller's CPU seconds (in brackets: the wall of one fleet-wide SSH run at -f {FORKS_DEFAULT})")
    say("  " + " " * 58 + "".join(f"{r['n']:>26,d}" for r in rows) + "  nodes")

    def line(label, cells):
        say(f"  {label:58s}" + "".join(f"{c:>26s}" for c in cells))
    for verb, label in (("provision", "SSH: provision, a re-run, once"), ("facts", "SSH: facts, once"),
                        ("verify", "SSH: verify on demand, once"), ("exec", "SSH: exec -- true, once")):
        if verb not in rows[0]:
            continue
        line(label, [f"{r[verb][0]:.1f} s ({r[verb][1]:.0f} s)" for r in rows])
    line(f"SSH: verify every {interval} s (per hour; one pass's wall)", [f"{r['ssh_health_hour']:.0f} s/h ({r['ssh_health_pass']:.0f} s)" for r in rows])
    if "slurm_jobs" in rows[0]:
        line(f"Slurm: health every {interval} s (slurmctld+munged, per hour)", [f"{r['slurm_health_hour']:.1f} s/h" for r in rows])
        line(f"Slurm: {jobs} jobs, sbatch (slurmctld+munged + sbatch)", [f"{r['slurm_jobs'][0]:.1f} + {r['slurm_jobs'][1]:.1f} s" for r in rows])
        line("gpurig run --scheduler slurm, one job (client)", [f"{r['gpurig_run']:.1f} s" for r in rows])
        line("Slurm: a drain or a resume", ["sinfo's reads + 1 update"] * len(rows))
    s = mo["ssh"]
    say("  forks: one process is CPU-bound once forks > (one host's own time) / (CPU per host): "
        + ", ".join(f"{v} {p['host_s'] / p['marginal_s']:.0f} ({1000 * p['host_s']:.0f} ms / {1000 * p['marginal_s']:.1f} ms)"
                    for v, p in s.items() if p["marginal_s"] > 0)
        + "; below that the wall grows as hosts / forks x one host's time; above it more forks change nothing")
    say(f"  the wall model at {mo['hosts']} hosts against the measured wall on loopback (where the hosts' sshd and probes share this machine's CPUs): "
        + ", ".join(f"{v} {ssh_wall(p, mo['hosts'], FORKS_DEFAULT):.1f} s / {p['measured_wall']:.1f} s" for v, p in s.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=100, help="loopback sshd hosts for part 1")
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs of each SSH command; gpurig run --scheduler slurm runs")
    ap.add_argument("--jobs", type=int, default=100, help="trivial sbatch jobs")
    ap.add_argument("--checks", type=int, default=20, help="runs of the health program by hand")
    ap.add_argument("--idle", type=int, default=60, help="seconds of each idle window (no checks; a check a second)")
    ap.add_argument("--only", default="ssh,slurm", help="ssh, slurm or both")
    ap.add_argument("--json", type=Path, help="also write every figure to this file")
    ap.add_argument("--from-json", type=Path, help="print the tables of an earlier run's --json file, measure nothing")
    args = ap.parse_args()
    if args.from_json:
        doc = json.loads(args.from_json.read_text())
        report(doc)
        return
    if os.geteuid() != 0:
        sys.exit("bench_slurm.py must run as root: it starts sshd hosts, a throwaway login user and Docker containers")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up on TERM as on Ctrl-C
    chosen = args.only.split(",")
    doc: dict = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}}
    if "ssh" in chosen:
        doc["ssh"] = ssh_part(args)
    if "slurm" in chosen:
        doc["slurm"] = slurm_part(args)
    doc["machine_after"] = machine()
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    report(doc)


def report(doc: dict) -> None:
    m = doc["machine"]
    say(f"\nmachine: {m['cpus']} CPUs, {m['mem_gib']} GiB, {m['os']}, kernel {m['kernel']}; load average {m['load']} at the start, "
        f"{doc.get('machine_after', m)['load']} at the end")
    if "ssh" in doc:
        ssh_table(doc["ssh"])
    if "slurm" in doc:
        slurm_table(doc["slurm"])
    if "ssh" in doc:
        mo = model(doc["ssh"], doc.get("slurm"))
        if "slurm" in mo:
            s, sl = mo["ssh"], mo["slurm"]
            say("\nSide by side, the controller's CPU:")
            say(f"  SSH, per host and operation: exec {1000 * s['exec']['marginal_s']:.1f} ms, verify {1000 * s['verify']['marginal_s']:.1f} ms, "
                f"facts {1000 * s['facts']['marginal_s']:.1f} ms (marginal; + {s['facts']['fixed_cpu_s']:.2f} s a command)")
            say(f"  Slurm, per job: slurmctld+munged {1000 * sl['job_ctld_s']:.2f} ms + sbatch {1000 * sl['job_sbatch_s']:.2f} ms; "
                f"gpurig run --scheduler slurm {1000 * sl['run_cpu_s']:.0f} ms of which {1000 * sl['run_prepare_per_node_s']:.0f} ms per node of the cluster")
            say(f"  Slurm, per node and health check: slurmctld+munged {1000 * sl['check_ctld_s']:.2f} ms (its RPC to slurmd; the program makes none "
                f"while healthy); on the node {1000 * sl['check_node_s']:.0f} ms")
        projection_table(mo)


def machine() -> dict:
    with open("/etc/os-release") as f:
        os_name = next((line.split("=", 1)[1].strip().strip('"') for line in f if line.startswith("PRETTY_NAME=")), "?")
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) / 2**20
    return {"cpus": os.cpu_count(), "mem_gib": round(mem), "os": os_name, "kernel": os.uname().release,
            "load": " ".join(f"{x:.2f}" for x in os.getloadavg())}


if __name__ == "__main__":
    main()

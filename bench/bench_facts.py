"""Benchmark: facts from N sshd hosts on loopback, gpurig vs pyinfra vs Ansible running the same probe lines, side by side.

Run as root (it starts sshd processes and a throwaway login user):

    python -m venv /tmp/gpurig-bench-venv
    /tmp/gpurig-bench-venv/bin/pip install ansible-core pyinfra
    python bench/bench_facts.py --hosts 100 --runs 3 --tools-venv /tmp/gpurig-bench-venv
    python bench/bench_facts.py --work exec ...     # the same small script through each tool's exec

Every tool gets the same hosts, the same key, the same known_hosts file (host
keys checked, none recorded during the timed runs) and the same remote work:
with ``--work facts`` (the default) the exact line ``gpurig facts --full``
sends (every probe section), run by pyinfra's ``exec`` and Ansible's
``shell`` module; with ``--work exec`` a small script (``EXEC_SCRIPT``)
through ``gpurig exec``, ``pyinfra exec`` and Ansible's ``shell``. Ansible
runs in its fastest configuration: no fact gathering, pipelining on,
ControlPersist (its default), a fresh ControlPath directory per run. Wall
time is the whole command, interpreter start-up included. The login user
has /bin/sh as its shell so a heavy ~/.bashrc on the bench machine (root's
runs `pyenv init` here) does not weigh on the tool that runs the most
commands.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpurig.facts import FACTS_SCRIPT  # noqa: E402
from tests.integration.hosts.conftest import SshdFarm, keygen  # noqa: E402

BENCH_USER = "gpurigbench"
# What --work exec runs on every host: the "same small script" (a few short processes, a few lines back).
EXEC_SCRIPT = "uname -sr; nproc; head -n 2 /proc/meminfo; id -un"


def raw(line: str) -> str:
    """``line`` as an Ansible ad-hoc argument, rendered to itself: Ansible templates arguments (the probe holds {{ and {#),
    and reads one that starts with "{" as JSON, so the raw block opens after the first character."""
    return line[:1] + "{% raw %}" + line[1:] + "{% endraw %}"


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, int, int]:
    """(wall s, cpu s of the command and its children, peak RSS of the main process in MiB, exit code)."""
    start = time.monotonic()
    log = open(cwd / "last-run.log", "wb")
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    log.close()
    if proc.returncode != 0:
        print((cwd / "last-run.log").read_text(errors="replace")[-3000:], file=sys.stderr)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss // 1024, proc.returncode


def make_user(client_pub: Path) -> None:
    # Password '*': no password login, but not a locked account (which sshd without PAM refuses).
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", "-p", "*", BENCH_USER], check=True)
    ssh = Path(f"/home/{BENCH_USER}/.ssh")
    ssh.mkdir(mode=0o700)
    shutil.copy(client_pub, ssh / "authorized_keys")
    subprocess.run(["chown", "-R", f"{BENCH_USER}:{BENCH_USER}", str(ssh)], check=True)


def drop_user() -> None:
    subprocess.run(["userdel", "-r", "-f", BENCH_USER], capture_output=True)


def write_inventories(work: Path, hosts, key: Path) -> tuple[Path, Path, Path]:
    inv_dir = work / "inventory"
    inv_dir.mkdir()
    known = inv_dir / "known_hosts"  # gpurig's project known_hosts; the others are pointed at it
    # each line: the name, then the public key file's key type and key (its comment dropped)
    known.write_text("".join(f"{h.known_hosts_name} {' '.join(h.host_key.with_suffix('.pub').read_text().split()[:2])}\n" for h in hosts))
    lines = [
        "all:",
        "  vars:",
        f"    ansible_user: {BENCH_USER}",
        f"    ansible_ssh_private_key_file: {key}",
        "    ansible_python_interpreter: /usr/bin/python3",
        "  hosts:",
    ]
    lines += [f"    {h.name}: {{ansible_host: 127.0.0.1, ansible_port: {h.port}}}" for h in hosts]
    yaml_inv = inv_dir / "hosts.yaml"
    yaml_inv.write_text("\n".join(lines) + "\n")
    py_inv = work / "pyinfra_inventory.py"
    entries = ",\n".join(
        f"    ({h.name!r}, {{'ssh_hostname': '127.0.0.1', 'ssh_port': {h.port}, 'ssh_user': {BENCH_USER!r}, "
        f"'ssh_key': {str(key)!r}, 'ssh_known_hosts_file': {str(known)!r}, 'ssh_strict_host_key_checking': 'yes'}})"
        for h in hosts
    )
    py_inv.write_text(f"hosts = [\n{entries},\n]\n")
    return yaml_inv, py_inv, known


def main() -> None:
    args, tools, venv_bin = bench_args(__doc__, "bench_facts.py", "gpurig,pyinfra,ansible",
                                       lambda ap: ap.add_argument("--work", choices=("facts", "exec"), default="facts"))
    script = FACTS_SCRIPT if args.work == "facts" else EXEC_SCRIPT

    with bench_hosts(args.hosts, "gpurig-bench-") as (work, key, hosts):
        yaml_inv, py_inv, known = write_inventories(work, hosts, key)
        env = {**os.environ, "HOME": str(work), "COLUMNS": "200", "PYTHONPATH": str(REPO)}  # this checkout, not whichever gpurig pip installed
        env.pop("SSH_AUTH_SOCK", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # each tool runs with its bytecode cached, as installed
        shared = ["--inventory", str(yaml_inv), "--forks", str(args.hosts), "--host-key-policy", "strict", "--json", str(work / "gpurig.json")]
        gpurig = [sys.executable, "-c", "import sys; from gpurig.cli import main; main(sys.argv)"]
        commands = {
            "gpurig": [*gpurig, "facts", "--full", *shared] if args.work == "facts" else [*gpurig, "exec", *shared, "--", script],
            "pyinfra": [str(venv_bin / "pyinfra"), str(py_inv), "--parallel", str(args.hosts), "-y", "exec", "--", script],
            "ansible": [str(venv_bin / "ansible"), "all", "-i", str(yaml_inv), "-f", str(args.hosts), "-o",
                        "-m", "ansible.builtin.shell", "-a", raw(script)],
        }
        fastest = {**ansible_ssh_env(known), "ANSIBLE_PIPELINING": "True", "ANSIBLE_GATHERING": "explicit"}
        results = run_interleaved(tools, commands, env, work, args.runs, venv_bin, fastest)
        gp = json.loads((work / "gpurig.json").read_text()) if "gpurig" in tools else None
        print()
        what = "facts (every probe section)" if args.work == "facts" else f"exec of {EXEC_SCRIPT!r}"
        print(f"{what} on {len(hosts)} hosts, the same lines through each tool, median of {args.runs} runs "
              "(wall, CPU of the tool and its children, peak RSS of the main process):")
        med = {name: statistics.median(r[0] for r in rs) for name, rs in results.items()}
        cpu = {name: statistics.median(r[1] for r in rs) for name, rs in results.items()}
        for name, rs in results.items():
            line = f"  {name:8s} {med[name]:7.2f}s  cpu {cpu[name]:6.2f}s  peak {max(r[2] for r in rs):4d} MiB"
            if "gpurig" in med and name != "gpurig":
                line += (f"   gpurig/{name}: wall {med['gpurig'] / med[name]:.2f}x, cpu {cpu['gpurig'] / cpu[name]:.2f}x"
                         f"  ({name} takes {med[name] / med['gpurig']:.1f}x as long)")
            print(line)
        if gp:
            print(f"  gpurig report: {gp['summary']}")


def bench_args(doc: str, script: str, tools: str, more=None) -> tuple[argparse.Namespace, list[str], Path]:
    """(flags, the tools to run, the tools venv's bin): the host benches' flags (``more(parser)`` adds its own); root and the tools' venv checked."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tools-venv", type=Path, default=Path(os.environ.get("GPURIG_BENCH_VENV", "/tmp/gpurig-bench-venv")))
    ap.add_argument("--only", default=tools)
    if more:
        more(ap)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit(f"{script} must run as root: it starts sshd hosts and creates a throwaway login user")
    chosen = args.only.split(",")
    venv_bin = args.tools_venv.absolute() / "bin"  # the tools run with the bench's work folder as their cwd
    for tool, binary in {"pyinfra": "pyinfra", "ansible": "ansible"}.items():
        if tool in chosen and not (venv_bin / binary).exists():
            sys.exit(f"{venv_bin / binary} missing: pip install ansible-core pyinfra into {args.tools_venv}")
    return args, chosen, venv_bin


def ansible_ssh_env(known: Path) -> dict[str, str]:
    """Ansible's ssh options pointing at gpurig's known_hosts (gpurig refuses UserKnownHostsFile in the inventory)."""
    return {"ANSIBLE_SSH_COMMON_ARGS": f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes"}


@contextlib.contextmanager
def bench_hosts(count: int, prefix: str):
    """(work dir, client key, hosts): ``count`` sshd hosts on loopback and the throwaway login user, all gone afterwards."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    key = keygen(work / "id_ed25519", "bench")
    (work / "sshd").mkdir()
    farm = SshdFarm(work / "sshd", key.with_suffix(".pub"))
    drop_user()
    make_user(key.with_suffix(".pub"))
    try:
        t = time.monotonic()
        hosts = farm.start(count, prefix="gpu")
        print(f"{len(hosts)} sshd hosts up in {time.monotonic() - t:.1f}s; {os.cpu_count()} CPUs")
        yield work, key, hosts
    finally:
        farm.stop_all()
        drop_user()
        shutil.rmtree(work, ignore_errors=True)


def run_interleaved(names, commands, env, work: Path, runs: int, venv_bin: Path, ansible_env=None, after=None, accept=None) -> dict[str, list]:
    """Each tool once per round, rounds repeated: {tool: [(wall, cpu, peak MiB, exit)]}; a failing tool ends the bench.

    ``ansible_env`` adds settings to Ansible's environment; ``after(name)`` checks a run's output;
    ``accept`` maps a tool to the exit codes that are not failures (default {0}).
    """
    results: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in names}
    for run in range(runs):
        for name in names:
            run_env = dict(env)
            if name == "ansible":
                # A fresh ControlMaster directory per run: every run starts cold, like the others.
                run_env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(work / f"cp-{run}")
                run_env["ANSIBLE_HOST_KEY_CHECKING"] = "True"
                run_env["PATH"] = f"{venv_bin}:{env['PATH']}"
                run_env.update(ansible_env or {})
            results[name].append(timed(commands[name], run_env, work))
            wall, cpu, rss, rc = results[name][-1]
            print(f"run {run + 1} {name:9s} {wall:7.2f}s wall  {cpu:7.2f}s cpu  {rss:5d} MiB peak  exit {rc}", flush=True)
            if rc not in (accept or {}).get(name, {0}):
                sys.exit(f"{name} failed: its figures would not be comparable")
            if name == "ansible":
                _stop_control_masters(work / f"cp-{run}")
            if after:
                after(name)
    return results


def _stop_control_masters(directory: Path) -> None:
    """Ansible leaves one ssh ControlMaster per host running for 60 s; end them so the next run starts clean."""
    if not directory.is_dir():
        return
    for sock in directory.iterdir():
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True, timeout=10)


if __name__ == "__main__":
    main()

"""Mutation audit (issue 34): one plausible bug at a time, each must make its named unit tests fail.

Run on demand, not in CI (a full run is a few hundred test-file runs):

    python3 tests/tools/mutation_audit.py              # every mutation, one at a time
    python3 tests/tools/mutation_audit.py -j 2         # two at a time
    python3 tests/tools/mutation_audit.py --only ECC   # those whose area or description holds ECC

Each mutation replaces one exact text in one file of a scratch copy of the
working tree (the checkout is never touched), then runs the named test files
there with ``python3 -m pytest -x -q -p no:cacheprovider`` (``-m`` puts the
copy's gpurig first on sys.path). A run that fails kills the mutation. The
same test files are run once on the unmutated copy first: a file that fails
there would "kill" every mutation and proves nothing, so the audit stops.
Exit 1 when a mutation survived or its old text is not found exactly once
(a mutation that no longer applies has not been checked).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 900  # a mutation that makes a test hang is killed too (pytest-timeout would stop it later)


@dataclass(frozen=True)
class Mutation:
    area: str
    description: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


U = "tests/unit/"
MUTATIONS: tuple[Mutation, ...] = (
    # --- the five survivors of the held-out audit -------------------------------------------------
    Mutation("nvidia-smi XML", "(a) pre-v12 uncorrectable ECC read from single_bit", "checks/verify_host.py",
             'counts = [_int(volatile, "double_bit/total")]', 'counts = [_int(volatile, "single_bit/total")]',
             (U + "verify/test_verify_host.py", U + "test_slurm_health.py")),
    Mutation("token/--json", "(b) access lines (Jupyter's token) in deploy --json", "gpurig/deploy/apply.py",
             '"exit_code": d.get("exit_code")}', '"exit_code": d.get("exit_code"), "access": list(d.get("access", ()))}',
             (U + "deploy/test_plan.py", U + "deploy/test_deploy_output.py")),
    Mutation("token/--json", "(c) access lines on stdout under --json -", "gpurig/flows/fleetdeploy.py",
             '    out = err_console if opts.json == "-" else console\n', "    out = console\n",
             (U + "deploy/test_deploy_output.py",)),
    Mutation("inventory", "(d) group depth from its last parent, not its deepest", "gpurig/inventory/loader.py",
             "depth[c] = max(depth[c], depth[g] + 1)", "depth[c] = depth[g] + 1",
             (U + "test_inventory.py", U + "test_inventory_cli.py")),
    Mutation("daemon.json", "(e) old .gpurig-bak restored on a host that had none", "gpurig/steps/daemon.py",
             'if [ "$had" = yes ] && [ -n "$backup" ]; then', 'if [ -n "$backup" ]; then',
             (U + "test_daemon_safety.py",)),
    # --- verify's figures and fail-closed rules ----------------------------------------------------
    Mutation("verify figures", "matmul TFLOP/s counts n^3, not 2n^3", "checks/verify_torch.py",
             "return 2 * n**3 / seconds / 1e12", "return n**3 / seconds / 1e12", (U + "verify/test_verify_figures.py",)),
    Mutation("verify figures", "memory bandwidth counts only the bytes read", "checks/verify_torch.py",
             "return 2 * nbytes / seconds / 1e9  # bytes read plus bytes written", "return nbytes / seconds / 1e9",
             (U + "verify/test_verify_figures.py",)),
    Mutation("verify figures", "PCIe h2d/d2h figures swapped", "checks/verify_torch.py",
             "return nbytes / h2d / 1e9, nbytes / d2h / 1e9", "return nbytes / d2h / 1e9, nbytes / h2d / 1e9",
             (U + "verify/test_verify_figures.py",)),
    Mutation("verify fail-closed", "a host probe that skipped everything is not failed", "gpurig/verify/records.py",
             '    if not ran(host, "host"):\n', '    if not host:\n',
             (U + "verify/test_verify_fails_closed.py", U + "verify/test_verify_runner.py")),
    Mutation("verify fail-closed", "a silent container probe passes when the toolkit failed", "gpurig/verify/records.py",
             'if target and not ran(inner, "container") and not any(r.status == "fail" for r in inner):',
             'if target and not ran(inner, "container") and not inner:',
             (U + "verify/test_verify_fails_closed.py", U + "verify/test_verify_runner.py")),
    Mutation("verify host", "uncorrected ECC errors pass when ECC mode is unknown", "checks/verify_host.py",
             '    if g["ecc_enabled"] is False or errors is None:', '    if not g["ecc_enabled"] or errors is None:',
             (U + "verify/test_verify_host.py",)),
    # --- the driver-vs-CUDA rule ----------------------------------------------------------------
    Mutation("driver vs CUDA", "a driver just below the minimum is enough", "gpurig/image/compat.py",
             "return driver_key(driver) >= driver_key(minimum)", "return driver_key(driver)[:1] >= driver_key(minimum)[:1]",
             (U + "test_compat.py", U + "test_facts.py")),
    Mutation("driver vs CUDA", "an unknown CUDA needs no driver", "gpurig/image/compat.py",
             "return floor is None or driver_at_least(driver, floor)", "return True",
             (U + "test_compat.py", U + "test_facts.py")),
    # --- daemon.json validation and restore ------------------------------------------------------
    Mutation("daemon.json", "dockerd --validate not used on Docker 23+", "gpurig/steps/daemon.py",
             'check = VALIDATE if version and version >= (VALIDATE_SINCE, 0) else ""\n        checked',
             'check = VALIDATE if version and version > (VALIDATE_SINCE, 0) else ""\n        checked',
             (U + "test_daemon_safety.py", U + "test_operations.py")),
    Mutation("daemon.json", "the refused file is not moved aside", "gpurig/steps/daemon.py",
             'mv -f -- "$path" "$path.gpurig-rejected.$stamp"\n', 'cp -p -- "$path" "$path.gpurig-rejected.$stamp"\n',
             (U + "test_daemon_safety.py",)),
    # --- host-key checking --------------------------------------------------------------------------
    Mutation("host keys", "a changed host key is recorded instead of refused", "gpurig/connect/hostkeys.py",
             "            if known:\n                raise self._changed(target, key, known)\n",
             "            if known and self.policy == \"strict\":\n                raise self._changed(target, key, known)\n",
             (U + "test_hostkeys.py",)),
    Mutation("host keys", "strict accepts an unknown host", "gpurig/connect/hostkeys.py",
             '            if self.policy == "strict":\n                raise HostKeyError(',
             '            if self.policy == "strickt":\n                raise HostKeyError(',
             (U + "test_hostkeys.py",)),
    # --- rollout's rollback, batches and max-fail -------------------------------------------------
    Mutation("rollout", "verify failure leaves the host on the new image", "gpurig/deploy/rollhost.py",
             "        if not passed:\n            return back(", "        if passed is None:\n            return back(",
             (U + "deploy/test_rollout.py",)),
    Mutation("rollout", "a container new to the host survives the rollback", "gpurig/deploy/rollhost.py",
             "                if engine.container(t.spec.name) is not None:\n                    engine.remove(t.spec.name)",
             "                if engine.container(t.spec.name) is None:\n                    engine.remove(t.spec.name)",
             (U + "deploy/test_rollout.py",)),
    Mutation("rollout", "a failed rollback still reads rolled-back", "gpurig/deploy/rollhost.py",
             "    if failed:\n        state, why = FAILED,", "    if not failed:\n        state, why = FAILED,",
             (U + "deploy/test_rollout.py",)),
    Mutation("batch/max-fail", "--max-fail N stops at the Nth failure", "gpurig/deploy/rollplan.py",
             "return failures > max_fail", "return failures >= max_fail", (U + "deploy/test_rollout.py",)),
    Mutation("batch/max-fail", "a percentage batch rounds down", "gpurig/deploy/rollplan.py",
             "return max(1, math.ceil(total * value / 100))", "return max(1, total * value // 100)",
             (U + "deploy/test_rollout.py",)),
    Mutation("batch/max-fail", "the canary's hosts also start the first batch", "gpurig/deploy/rollplan.py",
             "    rest = order[canary:]\n", "    rest = order[max(canary - 1, 0):]\n", (U + "deploy/test_rollout.py",)),
    # --- promote's proof count ----------------------------------------------------------------
    Mutation("promote", "one proof short is enough", "gpurig/image/promote.py",
             "if len(found.hosts) >= min_hosts:", "if len(found.hosts) >= min_hosts - 1:", (U + "test_promote.py",)),
    Mutation("promote", "a host's passes counted once each, not once per host", "gpurig/image/promote.py",
             "return Proof(image_id, tuple(latest[n] for n in sorted(latest)))", "return Proof(image_id, tuple(passed))",
             (U + "test_promote.py",)),
    # --- run --wait's exit code and the GPU queue -----------------------------------------------
    Mutation("run --wait", "a failed job's own exit code is lost", "gpurig/jobs/views.py",
             "            return int(self.exit_code) or 1\n", "            return 1\n",
             (U + "jobs/test_job_views.py", U + "test_ssh_layer.py")),
    Mutation("GPU queue", "a job jumps the FIFO queue", "checks/job_agent.py",
             "        if int(meta.get(\"seq\") or 0) < seq:\n", "        if int(meta.get(\"seq\") or 0) > seq:\n",
             (U + "jobs/test_job_agent.py",)),
    Mutation("GPU queue", "a shared GPU is taken by an exclusive job", "checks/job_agent.py",
             "usable = [i for i in indexes if i not in held or (share and held[i][1])]",
             "usable = [i for i in indexes if i not in held or held[i][1]]", (U + "jobs/test_job_agent.py",)),
    Mutation("GPU queue", "--gpus all on another's device counts as one GPU", "checks/job_agent.py",
             "            elif count == -1:\n                taken = indexes\n",
             "            elif count == -1:\n                taken = indexes[:1]\n", (U + "jobs/test_job_agent.py",)),
    # --- Slurm's drain decision and gres from facts ---------------------------------------------
    Mutation("Slurm drain", "an admin's drain is overwritten", "checks/slurm_health.py",
             '    if node.drained_by() == "admin":\n', '    if node.drained_by() == "gpurig":\n',
             (U + "test_slurm_health.py",)),
    Mutation("Slurm drain", "the same failure drained again every run", "checks/slurm_health.py",
             '        if mark.get("by") == "gpurig":\n            return "none: drained already"',
             '        if mark.get("by") == "admin":\n            return "none: drained already"',
             (U + "test_slurm_health.py",)),
    Mutation("Slurm gres", "Gres counts GPUs from the first device only", "gpurig/slurm/conf.py",
             'return f"gpu:{self.gpu_type}:{len(self.gpus)}" if self.gpu_type else f"gpu:{len(self.gpus)}"',
             'return f"gpu:{self.gpu_type}:1" if self.gpu_type else "gpu:1"', (U + "test_slurm_cluster.py",)),
    Mutation("Slurm gres", "Gres type cut to 3 letters (A100 reads as A10)", "gpurig/slurm/conf.py",
             "    return word[:16] if word else None", "    return word[:3] if word else None",
             (U + "test_slurm_cluster.py",)),
    # --- the lock's hash and staleness checks ---------------------------------------------------
    Mutation("lock", "pip requirements without their sha256", "gpurig/image/lock.py",
             "f\"{w['name']}=={w['version']} --hash=sha256:{w['sha256']}\\n\"", "f\"{w['name']}=={w['version']}\\n\"",
             (U + "test_lock.py",)),
    Mutation("lock", "a lock for a torch the matrix dropped is not stale", "gpurig/image/lock.py",
             "and not _in_spec(spec, stale):", "and _in_spec(spec, stale):", (U + "test_lock.py",)),
    Mutation("lock", "changed inputs keep the old lock", "gpurig/image/lock.py",
             "        if _plain(was) != _plain(now):\n", "        if was is None and now is None and was != now:\n",
             (U + "test_lock.py",)),
    Mutation("lock", "the locked base checked by name only", "gpurig/image/lock.py",
             "if found is None or found.id != image_id:", "if found is None:", (U + "test_lock.py",)),
    # --- INI parsing ---------------------------------------------------------------------------
    Mutation("INI", "a host var given twice keeps the last", "gpurig/inventory/ini.py",
             "            if key in hvars:\n                raise", "            if key in () :\n                raise",
             (U + "test_inventory_ini.py",)),
    Mutation("INI", "host:port split where Ansible keeps the name", "gpurig/inventory/ini.py",
             "                if not _ANSIBLE_NAME.fullmatch(plain):\n                    break",
             "                if not _ANSIBLE_NAME.fullmatch(plain):\n                    pass",
             (U + "test_inventory_ini.py",)),
    Mutation("INI", "a literal that is not Python kept as an error", "gpurig/inventory/ini.py",
             "        return text  # not a literal", "        raise InventoryError(text, 'quote it')  # not a literal",
             (U + "test_inventory_ini.py",)),
    # --- outdated's exit codes ----------------------------------------------------------------
    Mutation("outdated", "cannot-tell exits 1 like 'newer'", "gpurig/image/outdated.py",
             "    if problems or unknown:\n        return 2", "    if problems or unknown:\n        return 1",
             (U + "test_outdated.py",)),
    Mutation("outdated", "newer releases exit 0", "gpurig/image/outdated.py",
             "    if newer:\n        return 1", "    if newer:\n        return 0",
             (U + "test_outdated.py",)),
    # --- interrupt handling --------------------------------------------------------------------
    Mutation("interrupt", "Ctrl-C exits 1, not 130", "gpurig/results.py",
             "            return self.stop_code or SIGINT_EXIT\n", "            return 1\n",
             (U + "test_fleet.py", U + "test_terminate.py")),
    Mutation("interrupt", "SIGTERM reported as Ctrl-C", "gpurig/cli/base.py",
             'code = getattr(stop, "exit_code", 128 + signal.SIGINT)', "code = 128 + signal.SIGINT",
             (U + "test_terminate.py",)),
    # --- the monitor's CSV names and diagnosis thresholds ---------------------------------------
    Mutation("monitor CSV", "power.draw without nvidia-smi's unit", "gpurig/monitor/csvfile.py",
             '("power.draw [W]", lambda g: _num(g.power_w, 2)),', '("power.draw", lambda g: _num(g.power_w, 2)),',
             (U + "test_monitor_outputs.py", U + "test_monitor_mig.py")),
    Mutation("monitor CSV", "memory columns swapped", "gpurig/monitor/csvfile.py",
             '("memory.used [MiB]", lambda g: _num(g.mem_used_mib)),', '("memory.used [MiB]", lambda g: _num(g.mem_total_mib)),',
             (U + "test_monitor_outputs.py", U + "test_monitor_mig.py")),
    Mutation("monitor diagnosis", "input-bound needs the busiest core at 99%", "gpurig/monitor/diagnose.py",
             "BUSY_CORE = 90.0", "BUSY_CORE = 99.0", (U + "test_monitor_outputs.py", U + "test_monitor_mig.py")),
    Mutation("monitor diagnosis", "idle below 50% utilisation", "gpurig/monitor/diagnose.py",
             "IDLE_UTIL = 30.0", "IDLE_UTIL = 50.0", (U + "test_monitor_outputs.py", U + "test_monitor_mig.py")),
    Mutation("monitor diagnosis", "memory full from 90%", "gpurig/monitor/diagnose.py",
             "    if peak < MEM_FULL:", "    if peak < MEM_FULL - 0.05:", (U + "test_monitor_outputs.py", U + "test_monitor_mig.py")),
    # --- the nvidia-smi parsers -----------------------------------------------------------------
    Mutation("nvidia-smi parsers", "a GPU line with a missing field still read", "gpurig/facts/parsers.py",
             "if len(parts) != 6 or whole_number(parts[0]) is None:", "if len(parts) < 5 or whole_number(parts[0]) is None:",
             (U + "test_facts.py", U + "test_facts_fails_closed.py")),
    Mutation("nvidia-smi parsers", "a GPU's memory.total dropped", "gpurig/facts/parsers.py",
             "gpus.append(Gpu(int(index), name, uuid, whole_number(memory), bus))", "gpus.append(Gpu(int(index), name, uuid, None, bus))",
             (U + "test_facts.py", U + "test_facts_fails_closed.py")),
    Mutation("nvidia-smi parsers", "open kernel module read as proprietary", "gpurig/facts/parsers.py",
             'flavour = "open" if "Open Kernel Module" in line else "proprietary"', 'flavour = "proprietary"',
             (U + "test_facts.py", U + "test_facts_system.py")),
    Mutation("nvidia-smi XML", "retired DBE pages read from the SBE count", "checks/verify_host.py",
             '"retired_dbe": _int(retired, "double_bit_retirement/retired_count"),',
             '"retired_dbe": _int(retired, "multiple_single_bit_retirement/retired_count"),', (U + "verify/test_verify_host.py",)),
    # --- the output-path checks --------------------------------------------------------------
    Mutation("output paths", "a link owned by another user is followed", "gpurig/files.py",
             "        if st.st_uid not in (me, 0):\n", "        if st.st_uid not in (me, 0, st.st_uid):\n",
             (U + "test_output_paths.py",)),
    Mutation("output paths", "a block device is written over", "gpurig/files.py",
             "    if stat.S_ISBLK(st.st_mode):\n", "    if stat.S_ISCHR(st.st_mode) and False:\n", (U + "test_output_paths.py",)),
    Mutation("output paths", "a directory taken as the report file", "gpurig/files.py",
             "    if stat.S_ISDIR(st.st_mode):\n        raise GpurigError(f\"{flag} {target} is a directory\"",
             "    if False:\n        raise GpurigError(f\"{flag} {target} is a directory\"",
             (U + "test_output_paths.py", U + "test_report.py")),
)


def tracked_files(root: Path) -> list[str]:
    """The working tree's files as git sees them (tracked, and untracked ones not ignored): what the copy holds."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p and (root / p).is_file()]


def make_copy(root: Path, files: list[str], into: Path) -> Path:
    into.chmod(0o755)  # mkdtemp's 0700 would hide the copy from the tests that run a probe as user nobody
    for rel in files:
        target = into / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    venv = root / ".bench-venv"  # ansible-inventory, which the inventory tests run live; never copied, only linked
    if venv.exists():
        (into / ".bench-venv").symlink_to(venv.resolve())
    return into


def apply(copy: Path, m: Mutation) -> str:
    """'' when applied, else why not (a mutation whose old text is not there exactly once was not checked)."""
    path = copy / m.path
    if not path.is_file():
        return f"{m.path} does not exist"
    text = path.read_text()
    found = text.count(m.old)
    if found != 1:
        return f"old text found {found} times in {m.path}"
    path.write_text(text.replace(m.old, m.new))
    return ""


def run_tests(copy: Path, tests: tuple[str, ...]) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        proc = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return proc.returncode, (failed[0] if failed else proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-200:])


def audit(m: Mutation, files: list[str]) -> tuple[str, str]:
    """(result, what killed it): killed, survived, or not applied."""
    with tempfile.TemporaryDirectory(prefix="gpurig-mutation-") as tmp:
        copy = make_copy(ROOT, files, Path(tmp))
        why = apply(copy, m)
        if why:
            return "NOT APPLIED", why
        code, said = run_tests(copy, m.tests)
        if code == 0:
            return "SURVIVED", said
        if code in (1, 124):  # test failures, or a hang
            return "killed", said
        return "ERROR", f"pytest exit {code}: {said}"  # 2-5: collection/usage errors prove nothing about the mutation


def baseline(files: list[str], tests: list[str]) -> str:
    """'' when every named test file passes on the unmutated copy; else its failure."""
    with tempfile.TemporaryDirectory(prefix="gpurig-mutation-base-") as tmp:
        copy = make_copy(ROOT, files, Path(tmp))
        code, said = run_tests(copy, tuple(tests))
        return "" if code == 0 else f"exit {code}: {said}"


def row(result: str, area: str, description: str, width: int = 80) -> str:
    head = f"{result:<11} {area[:18]:<18} "
    return head + textwrap.shorten(description, width - len(head), placeholder="...")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only the mutations whose area or description contains this text")
    parser.add_argument("-j", type=int, default=1, help="mutations run at once (each in its own copy)")
    parser.add_argument("-v", action="store_true", help="say which test failed for each killed mutation")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or args.only.lower() in f"{m.area} {m.description}".lower()]
    if not chosen:
        print(f"no mutation matches {args.only!r}", file=sys.stderr)
        return 1
    files = tracked_files(ROOT)
    tests = sorted({t for m in chosen for t in m.tests})
    broken = baseline(files, tests)
    if broken:
        print(f"the named tests fail without any mutation, so no result would mean anything: {broken}", file=sys.stderr)
        return 1
    print(row("result", "area", "mutation"))
    print("-" * 80)
    with ThreadPoolExecutor(max_workers=max(1, args.j)) as pool:
        results = list(pool.map(lambda m: audit(m, files), chosen))
    for m, (result, said) in zip(chosen, results):
        print(row(result, m.area, m.description))
        if args.v or result != "killed":
            print("    " + (said if len(said) <= 76 else said[:73] + "..."))
    killed = sum(1 for result, _ in results if result == "killed")
    print("-" * 80)
    print(f"{killed} of {len(chosen)} mutations killed" + ("" if killed == len(chosen) else f", {len(chosen) - killed} not"))
    return 0 if killed == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())

"""checks/slurm_health.py run as slurmd runs it (a subprocess, no environment but PWD and SLURMD_NODENAME), against a fake Slurm.

The probe that runs is the real checks/verify_host.py replaying recorded
outputs (tests/fixtures/verify/: an A100's `nvidia-smi -q -x`, a clean and an
Xid kernel log, nvidia-smi's no-driver message), given through the admin's
args file. sinfo and scontrol are one fake (fake_slurm below) on the test
hook's PATH: it keeps the node's state and reason in a file, answers
`sinfo -h -n NODE -o '%T|%E'` as Slurm 22.05 and 24.11 do (24.11 keeps the
reason after a resume) and records every call's argv, so a test sees each RPC
slurmctld would have got.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "checks" / "slurm_health.py"
FIX = ROOT / "tests" / "fixtures" / "verify"
NODE = "gpurig-n1"
CLEAN = ["--source", "smi", "--smi-xml", FIX / "a100-sxm4-mig-535.xml", "--proc-version", FIX / "proc-version-535.txt",
         "--dmesg", FIX / "dmesg-clean.txt"]  # passes, with one warn (persistence off)
XID = [*CLEAN[:-1], FIX / "dmesg-xid.txt"]  # Xid 48, 63, 79: host.xid fails
NO_DRIVER = ["--source", "smi", "--smi-xml", FIX / "nvidia-smi-no-driver.txt", "--proc-version", "/nonexistent",
             "--dmesg", FIX / "dmesg-clean.txt"]  # host.driver fails

# `scontrol show node` as Slurm 22.05.8 printed it on the lab's node (trimmed to the lines read and a few around)
SHOW_NODE = """\
NodeName={node} Arch=x86_64 CoresPerSocket=2 {space}
   CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.14
   Gres=gpu:a100:2
   NodeAddr={node} NodeHostName={node} Version=22.05.8
   RealMemory=24105 AllocMem=0 FreeMem=19310 Sockets=1 Boards=1
   State={flags} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu {space}
   CfgTRES=cpu=2,mem=24105M,billing=2
{reason}
"""

FAKE_SLURM = r'''#!/usr/bin/python3
# Fake sinfo/scontrol: the node's state lives in $ROOT/slurm.json; every call's argv goes to $ROOT/calls.jsonl.
import json, os, sys
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(root, "calls.jsonl"), "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\n")
path = os.path.join(root, "slurm.json")
s = json.load(open(path))
tool = os.path.basename(sys.argv[0])
if tool in s.get("broken", []):
    sys.stderr.write(tool + ": error: Unable to contact slurm controller (connect failure)\n")
    sys.exit(1)
if tool == "sinfo":
    for _ in range(s.get("partitions", 1)):
        print(s["state"] + "|" + s["reason"])
elif sys.argv[1:3] == ["show", "node"]:
    flags = "IDLE+DRAIN" if "drain" in s["state"] else "IDLE"
    reason = "   Reason=" + s["reason"] + " [root@2026-12-01T22:40:09]" if s["reason"] != "none" else ""
    print(s["show_node"].format(node=sys.argv[3], flags=flags, reason=reason, space=" "))
elif sys.argv[1] == "update":
    args = dict(a.split("=", 1) for a in sys.argv[2:])
    if args["state"] == "drain":
        s.update(state="drained", reason=args["reason"])
    elif args["state"] == "resume":
        s.update(state="idle", reason=s["reason"] if s.get("version") == "24.11" else "none")
    json.dump(s, open(path, "w"))
'''


class Node:
    """A fake node: the script's folder, the test hook's root with /etc/gpurig, /run, the log, and the fake Slurm."""

    def __init__(self, base: Path, script_dir: Path | None = None, version: str = "22.05") -> None:
        self.root = base / "root"
        (self.root / "bin").mkdir(parents=True)
        (self.root / "etc" / "gpurig").mkdir(parents=True)
        for tool in ("sinfo", "scontrol"):
            (self.root / "bin" / tool).write_text(FAKE_SLURM)
            (self.root / "bin" / tool).chmod(0o755)
        self.script = (script_dir or SCRIPT.parent) / "slurm_health.py"
        self.slurm = {"state": "idle", "reason": "none", "version": version, "show_node": SHOW_NODE}
        self.save()
        self.booted()

    def save(self) -> None:
        (self.root / "slurm.json").write_text(json.dumps(self.slurm))

    def set(self, **changes) -> None:
        self.slurm.update(changes)
        self.save()

    def state(self) -> str:
        s = json.loads((self.root / "slurm.json").read_text())
        return f"{s['state']}|{s['reason']}"

    def booted(self) -> None:
        """As after this program's first run since boot (a later test removes it to stand for a reboot)."""
        (self.root / "run" / "gpurig-health").mkdir(parents=True, exist_ok=True)
        (self.root / "run" / "gpurig-health" / "booted").touch()

    def reboot(self) -> None:
        shutil.rmtree(self.root / "run")

    def probe_args(self, args) -> None:
        (self.root / "etc" / "gpurig" / "slurm-health.args").write_text("".join(f"{a}\n" for a in args))

    def config(self, text: str) -> None:
        (self.root / "etc" / "gpurig" / "slurm-health.json").write_text(text)

    def run(self, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
        """The script with no environment but what slurmd gives it (and the test hook); resets the recorded calls."""
        calls = self.root / "calls.jsonl"
        calls.unlink(missing_ok=True)
        base = {"PWD": "/var/log/slurm", "SLURMD_NODENAME": NODE, "GPURIG_SLURM_HEALTH_ROOT": str(self.root)}
        proc = subprocess.run([sys.executable, str(self.script), *argv], capture_output=True, text=True, timeout=60,
                              env={**base, **(env or {})}, cwd=self.root)
        assert "Traceback" not in proc.stderr, proc.stderr
        proc.calls = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
        return proc

    def log(self) -> list[str]:
        path = self.root / "var" / "log" / "slurm" / "gpurig-health.log"
        return path.read_text().splitlines() if path.exists() else []


def updates(proc) -> list[list[str]]:
    return [c[1:] for c in proc.calls if c[:2] == ["scontrol", "update"]]


def drain(reason: str) -> list[str]:
    return ["update", f"nodename={NODE}", "state=drain", f"reason={reason}"]


RESUME = ["update", f"nodename={NODE}", "state=resume"]
SINFO = ["sinfo", "-h", "-n", NODE, "-o", "%T|%E"]


@pytest.fixture
def node(tmp_path) -> Node:
    return Node(tmp_path)


def test_passing_probe_costs_slurm_nothing(node):
    node.probe_args(CLEAN)
    proc = node.run()
    assert (proc.returncode, proc.stdout, proc.calls) == (0, "", [])
    [line] = node.log()
    assert f" {NODE} pass [none] " in line and "checks passed (1 warn: host.gpu0.persistence)" in line


def test_failing_driver_drains_the_node_with_the_record_and_its_detail(node):
    node.probe_args(NO_DRIVER)
    proc = node.run()
    assert proc.returncode == 1
    reason = proc.stdout.strip()
    assert reason.startswith("gpurig: host.driver: no NVIDIA GPU on this host") and len(reason) <= 200, reason
    assert proc.calls == [SINFO, ["scontrol", *drain(reason)]]
    assert node.state() == f"drained|{reason}"
    assert "fail [drain] gpurig: host.driver:" in node.log()[-1]


def test_uncorrectable_ecc_errors_in_nvidia_smis_older_schema_drain_the_node(node):
    """A GPU that corrupted memory must leave the queue whatever the driver's XML schema (pre-v12: double_bit)."""
    node.probe_args(["--source", "smi", "--smi-xml", FIX / "grid-p4-vgpu-513-ecc-dbe.xml", *CLEAN[4:]])
    proc = node.run()
    reason = proc.stdout.strip()
    assert proc.returncode == 1 and reason.startswith("gpurig: host.gpu0.ecc_uncorrected: "), reason
    assert node.state() == f"drained|{reason}"


def test_the_same_failure_again_drains_once(node):
    node.probe_args(XID)
    first = node.run()
    assert first.returncode == 1 and first.stdout.startswith("gpurig: host.xid: kernel log since boot: Xid 13")
    assert "Xid 79" not in first.stdout or len(first.stdout.strip()) <= 200
    assert len(updates(first)) == 1
    again = node.run()
    assert (again.returncode, again.stdout, again.calls) == (1, first.stdout, [])  # no RPC while nothing changed
    assert "[none: drained already]" in node.log()[-1]


def test_a_new_failure_reason_drains_again_with_it(node):
    node.probe_args(XID)
    node.run()
    node.probe_args(NO_DRIVER)
    proc = node.run()
    assert updates(proc) == [drain(proc.stdout.strip())] and proc.stdout.startswith("gpurig: host.driver:")


@pytest.mark.parametrize("version", ["22.05", "24.11"])
def test_passing_again_resumes_a_node_gpurig_drained_and_then_costs_nothing(tmp_path, version):
    node = Node(tmp_path, version=version)
    node.probe_args(XID)
    reason = node.run().stdout.strip()
    node.probe_args(CLEAN)
    proc = node.run()
    assert (proc.returncode, proc.calls) == (0, [SINFO, ["scontrol", *RESUME]])
    assert node.state() == ("idle|none" if version == "22.05" else f"idle|{reason}")  # 24.11 keeps the old reason
    assert "pass [resume]" in node.log()[-1]
    assert node.run().calls == []
    node.reboot()  # a reboot's first run reads the state once: idle with a gpurig reason (24.11) is no drain
    assert node.run().calls == [SINFO]
    assert node.state().startswith("idle|")


def test_an_admins_drain_is_never_touched(node):
    node.set(state="drained", reason="maintenance: new PSU")
    node.probe_args(CLEAN)
    assert updates(node.run()) == []
    node.probe_args(NO_DRIVER)
    proc = node.run()
    assert proc.returncode == 1 and proc.stdout.startswith("gpurig: host.driver:")
    assert proc.calls == [SINFO]  # looked, left it
    assert node.state() == "drained|maintenance: new PSU"
    assert "an admin's drain holds the node (maintenance: new PSU)" in node.log()[-1]
    assert node.run().calls == []  # failing under the admin's drain: looked at again only after ADMIN_RECHECK_S
    node.set(state="idle", reason="none")  # the admin resumes; the probe still fails
    mark = node.root / "run" / "gpurig-health" / "mark"
    old = json.loads(mark.read_text())
    mark.write_text(json.dumps({**old, "at": time.time() - 301}))
    proc = node.run()
    assert updates(proc) == [drain(proc.stdout.strip())]
    node.set(state="drained", reason="maintenance")  # an admin drains over gpurig's drain: passing leaves it
    node.probe_args(CLEAN)
    proc = node.run()
    assert proc.calls == [SINFO] and node.state() == "drained|maintenance"


def test_a_reboot_finds_a_gpurig_drain_from_before_and_resumes_it_when_passing(node):
    node.set(state="drained", reason="gpurig: host.xid: Xid 79 before the reboot")
    node.reboot()
    node.probe_args(CLEAN)
    proc = node.run()
    assert proc.calls == [SINFO, ["scontrol", *RESUME]] and node.state() == "idle|none"


def test_after_a_reboot_the_same_failure_is_not_drained_twice(node):
    node.probe_args(XID)
    reason = node.run().stdout.strip()
    node.reboot()
    assert node.run().calls == [SINFO]  # the drain is there already, with this reason
    assert node.state() == f"drained|{reason}"


def crashing_probe(tmp_path: Path, body: str | None) -> Path:
    """slurm_health.py copied into a folder of its own, beside a verify_host.py made of ``body`` (None: none)."""
    folder = tmp_path / "libexec"
    folder.mkdir()
    shutil.copy(SCRIPT, folder / "slurm_health.py")
    if body is not None:
        (folder / "verify_host.py").write_text(body)
    return folder


@pytest.mark.parametrize(("body", "expected"), [
    (None, "gpurig: probe: {folder}/verify_host.py is missing (install verify_host.py beside slurm_health.py)"),
    ("import sys\nprint('checking...')\n1/0\n", "gpurig: probe: verify_host.py exited 1: ZeroDivisionError: division by zero"),
    ("", "gpurig: probe: verify_host.py printed no JSON report: ''"),
    ("print('<html>502 Bad Gateway</html>')\n", "gpurig: probe: verify_host.py printed no JSON report: '<html>502 Bad Gateway</html>'"),
    ("print('[1, 2]')\n", "gpurig: probe: verify_host.py printed no host report: '[1, 2]'"),
    ("import json\nprint(json.dumps({'probe': 'host', 'version': 1, 'records': []}))\n", "gpurig: probe: verify_host.py reported no checks"),
    ("import json\nprint(json.dumps({'probe': 'host', 'version': 1, 'records': [{'id': 'host.driver', 'status': 'skip', "
     "'detail': 'not looked at'}]}))\n", "gpurig: probe: checked nothing: every check skipped (host.driver: not looked at)"),
    ("import sys\nsys.exit(2)\n", "gpurig: probe: verify_host.py exited 2: no message"),
], ids=["missing", "crashing", "silent", "garbage", "not-a-report", "no-records", "all-skipped", "exit-2"])
def test_a_probe_that_cannot_say_is_a_failure_and_drains(tmp_path, body, expected):
    folder = crashing_probe(tmp_path, body)
    node = Node(tmp_path, script_dir=folder)
    proc = node.run()
    reason = expected.format(folder=folder)
    assert (proc.returncode, proc.stdout) == (1, reason + "\n")
    assert updates(proc) == [drain(reason)]


def test_the_reason_is_one_clean_line_passed_as_one_argument_never_through_a_shell(tmp_path):
    detail = 'GPU 0\nbad "quoted" $(touch pwned) `touch pwned`; touch pwned\t\x1b[31mred\x00' + "x" * 300
    record = {"id": "host.gpu0.ecc_uncorrected", "status": "fail", "detail": detail}
    body = f"import json\nprint(json.dumps({{'probe': 'host', 'version': 1, 'records': [{record!r}]}}))\n"
    node = Node(tmp_path, script_dir=crashing_probe(tmp_path, body))
    proc = node.run()
    [update] = updates(proc)
    reason = update[-1].removeprefix("reason=")
    assert reason == proc.stdout.rstrip("\n") and len(reason) == 200 and reason.endswith("...")
    assert reason.startswith("gpurig: host.gpu0.ecc_uncorrected: GPU 0 bad 'quoted' $(touch pwned) `touch pwned`; touch pwned [31mred xxx")
    assert not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in reason) and '"' not in reason
    assert not list(tmp_path.rglob("pwned"))  # the fakes and the probe ran in node.root: nothing ran the $(...)
    assert len(update) == 4  # update, nodename, state, reason: one argv element each


def test_more_failures_are_counted_in_the_reason(tmp_path):
    records = [{"id": f"host.gpu{i}.remapped_rows", "status": "fail", "detail": "a row remap is pending"} for i in range(3)]
    body = f"import json\nprint(json.dumps({{'probe': 'host', 'records': {records!r}}}))\n"
    node = Node(tmp_path, script_dir=crashing_probe(tmp_path, body))
    assert node.run().stdout == ("gpurig: host.gpu0.remapped_rows: a row remap is pending "
                                 "(+2 more failing: host.gpu1.remapped_rows, host.gpu2.remapped_rows)\n")


def test_expectations_come_from_gpurigs_file_then_the_admins_then_the_command_line(node):
    node.probe_args(CLEAN)
    node.config('{"expect_gpus": 2, "expect_model": "A100"}')
    proc = node.run()
    assert proc.stdout.startswith("gpurig: host.gpu_count: ") and "1" in proc.stdout  # the capture holds one A100
    node.probe_args([*CLEAN, "--expect-gpus", "1"])  # the admin's file overrides gpurig's
    assert node.run().returncode == 0
    node.probe_args(CLEAN)
    assert node.run("--expect-gpus", "1").returncode == 0  # and the command line both
    node.config('{"expect_gpus": 1, "expect_model": "H100"}')
    assert node.run().stdout.startswith("gpurig: host.gpu_model: ")


@pytest.mark.parametrize(("text", "expected"), [
    ("{not json", "gpurig: config: {path}: unreadable or not JSON"),
    ('{"expect_gpu": 2}', "gpurig: config: {path}: unknown key 'expect_gpu' (known: expect_gpus, expect_model)"),
    ('{"expect_gpus": "2"}', "gpurig: config: {path}: expect_gpus must be an integer"),
    ("[2]", "gpurig: config: {path}: not a JSON object"),
])
def test_a_broken_config_is_a_failure_not_a_silent_pass(node, text, expected):
    node.probe_args(CLEAN)
    node.config(text)
    proc = node.run()
    assert proc.returncode == 1
    assert proc.stdout.startswith(expected.format(path=node.root / "etc" / "gpurig" / "slurm-health.json"))


def test_sinfo_failing_falls_back_to_scontrol_show_node(node):
    node.set(state="drained", reason="gpurig: host.xid: Xid 79", broken=["sinfo"])
    node.reboot()
    node.probe_args(CLEAN)
    proc = node.run()
    assert proc.calls == [SINFO, ["scontrol", "show", "node", NODE], ["scontrol", *RESUME]]


def test_a_controller_that_does_not_answer_is_retried_and_never_passes_the_node(node):
    node.set(broken=["sinfo", "scontrol"])
    node.probe_args(XID)
    proc = node.run()
    assert proc.returncode == 1 and updates(proc) == []  # state unknown: an admin's drain might be there
    assert "[none: node state unreadable, retried next run]" in node.log()[-1]
    node.set(broken=["scontrol"])  # reads work, the drain does not: tried again at the next run
    assert len(updates(node.run())) == 1 and "[drain failed: scontrol: error: Unable to contact" in node.log()[-1]
    node.set(broken=[])
    proc = node.run()
    assert updates(proc) == [drain(proc.stdout.strip())]
    assert node.run().calls == []


def test_dry_run_says_what_it_would_do_and_changes_nothing(node):
    node.probe_args(XID)
    proc = node.run("--dry-run")
    assert proc.returncode == 1 and proc.stdout.startswith("would drain: gpurig: host.xid:")
    assert updates(proc) == [] and not (node.root / "run" / "gpurig-health" / "mark").exists()


def test_without_slurmd_nodename_the_hostname_is_the_node(node):
    import socket

    node.probe_args(NO_DRIVER)
    proc = node.run(env={"SLURMD_NODENAME": ""})
    assert updates(proc)[0][1] == f"nodename={socket.gethostname().split('.')[0]}"


def test_the_log_is_moved_aside_past_a_megabyte(node):
    log = node.root / "var" / "log" / "slurm" / "gpurig-health.log"
    log.parent.mkdir(parents=True)
    log.write_text("old line\n" * 120_000)  # 1.08 MB
    node.probe_args(CLEAN)
    node.run()
    assert (log.parent / "gpurig-health.log.1").stat().st_size > 1 << 20
    assert len(node.log()) == 1


def test_a_hung_probe_is_a_failure_after_its_timeout(tmp_path):
    spec = importlib.util.spec_from_file_location("slurm_health", SCRIPT)
    health = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(health)
    hung = tmp_path / "verify_host.py"
    hung.write_text("import time\ntime.sleep(30)\n")
    health.PROBE, health.PROBE_TIMEOUT_S = str(hung), 0.5
    with pytest.raises(health.Failure) as caught:
        health.run_probe([])
    assert caught.value.reason == "gpurig: probe: verify_host.py did not finish in 0.5 s (a hung nvidia-smi or driver?)"


def test_slurmd_can_run_it_by_its_path_with_no_path_set(tmp_path):
    """The shebang (#!/usr/bin/env python3) finds python3 with no PATH at all, as under slurmd."""
    assert SCRIPT.read_text().startswith("#!/usr/bin/env python3\n") and os.access(SCRIPT, os.X_OK)
    node = Node(tmp_path)
    node.probe_args(CLEAN)
    proc = subprocess.run([str(SCRIPT)], env={"PWD": "/", "SLURMD_NODENAME": NODE, "GPURIG_SLURM_HEALTH_ROOT": str(node.root)},
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")

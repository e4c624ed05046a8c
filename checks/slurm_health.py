#!/usr/bin/env python3
"""Slurm's HealthCheckProgram for a GPU node: run gpurig's host probe; drain the node when it fails, resume it when it passes.

Standalone on purpose (Python 3.6+, stdlib only): slurmd runs it as root on
each node every HealthCheckInterval, with no environment but PWD and
SLURMD_NODENAME (so it sets its own PATH), and gives it no arguments.

    slurm.conf:  HealthCheckProgram=/usr/local/libexec/gpurig/slurm_health.py

What it reads, all optional except the probe:
    <this file's folder>/verify_host.py  the host probe (checks/verify_host.py), run as ``verify_host.py --json ARGS``
    /etc/gpurig/slurm-health.json        written by gpurig: {"expect_gpus": 2, "expect_model": "A100"}
                                         -> --expect-gpus 2 --expect-model A100
    /etc/gpurig/slurm-health.args        the admin's: more probe arguments, one per line (blank and # lines skipped);
                                         e.g. --expect-model H100, or the probe's replay flags in tests
    its own command line                 --expect-gpus N / --expect-model S, for a person running it by hand
Later sources win (the probe keeps the last of a repeated option): gpurig's
file, then the admin's, then the command line. ``--dry-run`` probes and says
what it would do, changing nothing.

The verdict: any record with status fail is a failure, and so is a probe that
cannot say (missing, crashed, timed out, printed no report, reported nothing,
or skipped every check): nothing checked is never a pass. warn and skip pass.
  fail -> the node is drained: ``scontrol update nodename=NODE state=drain
          reason="gpurig: <record id>: <detail>"`` (one line, at most 200
          characters), unless an admin drained it (a reason not starting with
          "gpurig:"), which is never touched; the reason is printed on stdout
          (slurmd logs it) and the exit status is 1.
  pass -> a node drained by gpurig (drain flag AND a "gpurig:" reason: Slurm
          24.11 keeps the old reason after a resume) is resumed; exit status 0.
NODE is $SLURMD_NODENAME, else the hostname. The state is read with
``sinfo -h -n NODE -o '%T|%E'`` (``scontrol show node`` where sinfo fails),
and only when something changed: a mark in /run/gpurig-health records what
this program last did, so a node that stays healthy, or stays failing for the
same reason, costs slurmctld no RPC. /run is empty after a boot, so the first
run after one reads the state once (a gpurig drain from before the reboot is
then resumed when the probe passes). An admin's drain over a failing node is
looked at again every ADMIN_RECHECK_S. Every run logs one line to
/var/log/slurm/gpurig-health.log (moved to .1 past about 1 MB).

Test hook: GPURIG_SLURM_HEALTH_ROOT=DIR puts /etc/gpurig, /run/gpurig-health
and /var/log/slurm under DIR and DIR/bin first on PATH (fake sinfo and
scontrol). slurmd never sets it.
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

ROOT = os.environ.get("GPURIG_SLURM_HEALTH_ROOT", "")
PATH = ":".join(([os.path.join(ROOT, "bin")] if ROOT else []) + ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin",
                                                                  "/usr/bin", "/sbin", "/bin"])
CONFIG = ROOT + "/etc/gpurig/slurm-health.json"
ARGS_FILE = ROOT + "/etc/gpurig/slurm-health.args"
STATE_DIR = ROOT + "/run/gpurig-health"
LOG = ROOT + "/var/log/slurm/gpurig-health.log"
PROBE = os.path.join(os.path.dirname(os.path.realpath(__file__)), "verify_host.py")
PREFIX = "gpurig:"
REASON_MAX = 200
LOG_MAX = 1 << 20
PROBE_TIMEOUT_S = 45  # slurmd kills a health check that runs past 60 s; a hung nvidia-smi is a failure of its own
SLURM_TIMEOUT_S = 20
ADMIN_RECHECK_S = 300
CONFIG_KEYS = {"expect_gpus": ("--expect-gpus", int), "expect_model": ("--expect-model", str)}


class Failure(Exception):
    """The probe could not give a verdict: the node fails for ``what`` (where it broke) and ``detail``."""

    def __init__(self, what, detail):
        super().__init__("{}: {}".format(what, detail))
        self.reason = reason_of(what, detail)


def one_line(text, limit=REASON_MAX):
    """``text`` as one line of printable characters, at most ``limit`` long (cut with '...')."""
    text = re.sub(r"[\x00-\x1f\x7f-\x9f]+", " ", str(text)).replace('"', "'")
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def reason_of(rid, detail):
    return one_line("{} {}: {}".format(PREFIX, rid, detail))


# ---------------------------------------------------------------- the probe

def probe_args(cli):
    """--expect-* from gpurig's file, then the admin's lines, then this command line's."""
    args = []
    try:
        with open(CONFIG) as f:
            config = json.load(f)
    except FileNotFoundError:
        config = {}
    except (OSError, ValueError) as err:
        raise Failure("config", "{}: unreadable or not JSON ({})".format(CONFIG, err)) from err
    if not isinstance(config, dict):
        raise Failure("config", "{}: not a JSON object".format(CONFIG))
    for key, value in config.items():
        if key not in CONFIG_KEYS:
            raise Failure("config", "{}: unknown key {!r} (known: {})".format(CONFIG, key, ", ".join(sorted(CONFIG_KEYS))))
        flag, kind = CONFIG_KEYS[key]
        if value is None:
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            raise Failure("config", "{}: {} must be {}".format(CONFIG, key, "an integer" if kind is int else "a string"))
        args += [flag, str(value)]
    try:
        with open(ARGS_FILE) as f:
            args += [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError) as err:
        raise Failure("config", "{}: unreadable ({})".format(ARGS_FILE, err)) from err
    if cli.expect_gpus is not None:
        args += ["--expect-gpus", str(cli.expect_gpus)]
    if cli.expect_model is not None:
        args += ["--expect-model", cli.expect_model]
    return args


def python():
    """This interpreter's path: sys.executable is empty when python3 was found with no PATH (slurmd's env)."""
    if sys.executable and os.path.isabs(sys.executable):
        return sys.executable
    return shutil.which("python3", path=PATH) or "/usr/bin/python3"


def run_probe(args):
    """The probe's records; Failure when it cannot give them."""
    if not os.path.isfile(PROBE):
        raise Failure("probe", "{} is missing (install verify_host.py beside slurm_health.py)".format(PROBE))
    env = dict(os.environ, PATH=PATH, LC_ALL="C")
    try:
        proc = subprocess.run([python(), PROBE, "--json"] + args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, errors="replace", env=env,
                              timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise Failure("probe", "verify_host.py did not finish in {} s (a hung nvidia-smi or driver?)".format(PROBE_TIMEOUT_S)) from None
    except OSError as err:
        raise Failure("probe", "verify_host.py could not start: {}".format(err)) from err
    if proc.returncode != 0:
        last = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["no message"]
        raise Failure("probe", "verify_host.py exited {}: {}".format(proc.returncode, last[0]))
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise Failure("probe", "verify_host.py printed no JSON report: {!r}".format(proc.stdout.strip()[:60])) from None
    records = doc.get("records") if isinstance(doc, dict) and doc.get("probe") == "host" else None
    if not isinstance(records, list) or not all(isinstance(r, dict) and "id" in r and "status" in r for r in records):
        raise Failure("probe", "verify_host.py printed no host report: {!r}".format(proc.stdout.strip()[:60]))
    if not records:
        raise Failure("probe", "verify_host.py reported no checks")
    return records


def verdict(records):
    """(reason, None) for the first failing record (with how many more fail), else (None, a summary)."""
    failing = [r for r in records if r["status"] == "fail"]
    if failing:
        first = failing[0]
        more = " (+{} more failing: {})".format(len(failing) - 1, ", ".join(r["id"] for r in failing[1:4])) if failing[1:] else ""
        detail = one_line(first.get("detail") or "failed", REASON_MAX - len(PREFIX) - len(first["id"]) - len(more) - 3)
        return one_line("{} {}: {}{}".format(PREFIX, first["id"], detail, more)), None
    counted = [r for r in records if r["status"] in ("pass", "warn")]
    if not counted:
        skipped = records[0]
        return reason_of("probe", "checked nothing: every check skipped ({}: {})".format(skipped["id"], skipped.get("detail"))), None
    warns = [r["id"] for r in records if r["status"] == "warn"]
    return None, "{} checks passed".format(len(counted)) + (" ({} warn: {})".format(len(warns), ", ".join(warns[:3])) if warns else "")


# ---------------------------------------------------------------- Slurm

def slurm(argv):
    """Run a Slurm command (an argv list, no shell); (exit status, stdout, stderr)."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, errors="replace", env=dict(os.environ, PATH=PATH),
                              timeout=SLURM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return 124, "", "{} timed out after {} s".format(argv[0], SLURM_TIMEOUT_S)
    except OSError as err:
        return 127, "", str(err)
    return proc.returncode, proc.stdout, proc.stderr


def node_state(node):
    """(state, reason) as slurmctld has them, e.g. ("drained", "gpurig: ..."); None when neither command answers."""
    rc, out, _ = slurm(["sinfo", "-h", "-n", node, "-o", "%T|%E"])
    lines = [line for line in out.splitlines() if "|" in line]
    if rc == 0 and lines:  # one line per partition holding the node, all alike
        state, reason = lines[0].split("|", 1)
        return state.strip().lower(), reason.strip()
    rc, out, _ = slurm(["scontrol", "show", "node", node])
    found = re.search(r"\bState=(\S+)", out)
    if rc != 0 or not found:
        return None
    said = re.search(r"^\s*Reason=(.*?)(?: \[[^\]]*\])?\s*$", out, re.M)
    return found.group(1).lower(), said.group(1) if said else "none"


class Node:
    """This node as slurmctld sees it, read at most once per run (each read is an RPC)."""

    def __init__(self, name):
        self.name = name
        self._state = ()

    def state(self):
        if self._state == ():
            self._state = node_state(self.name)
        return self._state

    def drained_by(self):
        """'gpurig' or 'admin' when the node carries the drain flag (by the reason's prefix), else None."""
        state = self.state()
        if state is None or "drain" not in state[0]:
            return None
        return "gpurig" if state[1].startswith(PREFIX) else "admin"

    def update(self, *settings):
        rc, out, err = slurm(["scontrol", "update", "nodename=" + self.name] + list(settings))
        return None if rc == 0 else one_line(err or out or "exit status {}".format(rc), 120)


# ---------------------------------------------------------------- the mark: what this program last did

def read_mark():
    try:
        with open(os.path.join(STATE_DIR, "mark")) as f:
            mark = json.load(f)
        return mark if isinstance(mark, dict) else None
    except (OSError, ValueError):
        return None


def write_mark(mark):
    path = os.path.join(STATE_DIR, "mark")
    if mark is None:
        if os.path.exists(path):
            os.remove(path)
        return
    with open(path + ".tmp", "w") as f:
        json.dump(mark, f)
    os.replace(path + ".tmp", path)


def first_run_since_boot():
    """True once per boot (/run is a tmpfs): then the mark is rebuilt from slurmctld's view."""
    os.makedirs(STATE_DIR, mode=0o755, exist_ok=True)
    booted = os.path.join(STATE_DIR, "booted")
    if os.path.exists(booted):
        return False
    open(booted, "w").close()
    return True


# ---------------------------------------------------------------- deciding

def on_failure(node, reason, mark, dry):
    """Drain for ``reason`` unless done already or an admin's drain holds the node; returns what was done."""
    if mark and mark.get("reason") == reason:
        if mark.get("by") == "gpurig":
            return "none: drained already"
        if time.time() - mark.get("at", 0) < ADMIN_RECHECK_S:
            return "none: an admin's drain holds the node"
    if node.state() is None:
        return "none: node state unreadable, retried next run"
    if node.drained_by() == "admin":
        if not dry:
            write_mark({"by": "admin", "reason": reason, "at": time.time()})
        return "none: an admin's drain holds the node ({})".format(one_line(node.state()[1], 60))
    if dry:
        return "would drain"
    failed = node.update("state=drain", "reason=" + reason)
    if failed:
        return "drain failed: " + failed
    write_mark({"by": "gpurig", "reason": reason})
    return "drain"


def on_pass(node, mark, dry):
    """Resume the node when gpurig drained it (and it still is); returns what was done."""
    if not mark:
        return "none"
    if mark.get("by") != "gpurig":
        if not dry:
            write_mark(None)
        return "none"
    if node.state() is None:
        return "none: node state unreadable, retried next run"
    if node.drained_by() != "gpurig":
        if not dry:
            write_mark(None)
        return "none: not drained by gpurig"
    if dry:
        return "would resume"
    failed = node.update("state=resume")
    if failed:
        return "resume failed: " + failed
    write_mark(None)
    return "resume"


def log(line):
    """One line to the log; a log that cannot be written never changes the verdict."""
    try:
        os.makedirs(os.path.dirname(LOG), exist_ok=True)
        if os.path.exists(LOG) and os.path.getsize(LOG) > LOG_MAX:
            os.replace(LOG, LOG + ".1")
        with open(LOG, "a", encoding="utf-8", errors="replace") as f:
            f.write(line + "\n")
    except OSError as err:
        sys.stderr.write("slurm_health.py: cannot write {}: {}\n".format(LOG, err))


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="slurm_health.py", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--expect-gpus", type=int, metavar="N", help="GPUs this node must have (else slurm-health.json's)")
    parser.add_argument("--expect-model", metavar="SUBSTRING", help="GPU model this node must have")
    parser.add_argument("--dry-run", action="store_true", help="probe and say what would be done; change nothing")
    return parser.parse_args(argv)


def main(argv=None):
    cli = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ["PATH"] = PATH
    node = Node(os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0])
    started = time.time()
    reason, summary = None, None
    try:
        try:
            reason, summary = verdict(run_probe(probe_args(cli)))
        except Failure as err:
            reason = err.reason
        mark = read_mark()
        if not cli.dry_run and first_run_since_boot() and not mark and node.drained_by() == "gpurig":
            mark = {"by": "gpurig", "reason": node.state()[1]}  # drained before this boot: resumed once it passes
            write_mark(mark)
        action = on_failure(node, reason, mark, cli.dry_run) if reason else on_pass(node, mark, cli.dry_run)
    except Exception as err:  # this program's own fault must not leave a node unchecked and passing either
        reason = reason or reason_of("slurm_health.py", "crashed: {}: {}".format(type(err).__name__, err))
        action = "none: crashed"
    log("{} {} {} [{}] {} ({:.1f} s)".format(time.strftime("%Y-%m-%dT%H:%M:%S"), node.name, "fail" if reason else "pass",
                                           action, reason or summary, time.time() - started))
    if cli.dry_run:
        print("{}: {}".format(action, reason or summary))
    elif reason:
        print(reason)
    return 1 if reason else 0


if __name__ == "__main__":
    sys.exit(main())

"""A fleet run spread over worker processes: every host's result in inventory order, progress relayed, and Ctrl-C/SIGTERM
stopping every worker's commands, as one process does. Real forked workers, real local shells."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpurig.connect.connector import Connector
from gpurig.connect.fleet import run_fleet
from gpurig.connect.spread import SPREAD_MIN, worker_count
from gpurig.connect.ssh import SSHSettings
from gpurig.errors import HostError
from gpurig.inventory import Host
from gpurig.results import FleetEvents, Outcome
from gpurig.status import Status
from tests.processes import running

ROOT = Path(__file__).resolve().parents[2]


def hosts(n: int) -> list[Host]:
    return [Host(name=f"l{i:03d}", groups=("ungrouped",), vars={}, address="localhost", connection="local") for i in range(n)]


def connector(tmp_path) -> Connector:
    return Connector(SSHSettings(project_known_hosts=tmp_path / "kh", user_known_hosts=None, ssh_config=None))


class Recorder(FleetEvents):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def start(self, total, label):
        self.calls.append(("start", total, label))

    def state(self, host, state):
        self.calls.append(("state", host, state))

    def finished(self, result):
        self.calls.append(("finished", result.host, result.status))

    def stop(self):
        self.calls.append(("stop",))


def test_the_hosts_run_in_the_workers_and_every_result_comes_back_in_inventory_order(tmp_path):
    def work(conn):
        if conn.name == "l001":
            raise HostError("no docker here", "install it", host=conn.name)
        if conn.name == "l002":
            return Outcome(status=Status.SKIPPED, detail="check mode")
        return int(conn.run("echo $PPID").stdout)  # the shell's parent: the process that ran the host

    events = Recorder()
    report = run_fleet(hosts(12), work, connector=connector(tmp_path), workers=3, events=events, label="exec",
                       report_path=tmp_path / "report.json")
    assert [r.host for r in report.results] == [h.name for h in hosts(12)]
    by = report.by_host()
    assert by["l001"].status == "failed" and by["l001"].reason == "no docker here" and by["l001"].fix == "install it"
    assert by["l002"].status == "skipped" and by["l002"].reason == "check mode"
    workers = {r.data for r in report.results if r.status == "ok"}
    assert len(workers) == 3 and os.getpid() not in workers  # three processes besides this one ran the hosts
    assert report.summary == {"ok": 10, "changed": 0, "failed": 1, "unreachable": 0, "skipped": 1} and report.exit_code == 1
    assert json.loads((tmp_path / "report.json").read_text())["summary"] == report.summary
    assert events.calls[0] == ("start", 12, "exec") and events.calls[-1] == ("stop",)
    assert sorted(c[1] for c in events.calls if c[0] == "finished") == [h.name for h in hosts(12)]
    assert {c[1] for c in events.calls if c[0] == "state" and c[2] == "running"} == {h.name for h in hosts(12)}


def test_a_result_that_cannot_leave_its_worker_fails_that_host_alone(tmp_path):
    report = run_fleet(hosts(4), lambda conn: (lambda: None) if conn.name == "l003" else conn.name, connector=connector(tmp_path), workers=2)
    by = report.by_host()
    assert by["l003"].status == "failed" and "its result could not leave the worker" in by["l003"].reason
    assert [by[f"l00{i}"].data for i in range(3)] == ["l000", "l001", "l002"]


def test_a_worker_that_dies_costs_its_unfinished_hosts_and_says_so(tmp_path):
    def work(conn):
        if conn.name == "l000":
            os.kill(os.getpid(), signal.SIGKILL)  # the worker holding l000, l002, l004 dies mid-run
        return "done"

    report = run_fleet(hosts(6), work, connector=connector(tmp_path), workers=2, forks=1)
    by = report.by_host()
    assert [by[h].data for h in ("l001", "l003", "l005")] == ["done"] * 3  # the other worker's share is whole
    for name in ("l000", "l002", "l004"):
        assert by[name].status == "failed" and "ended (killed by signal 9) before reporting this host" in by[name].reason
    assert report.exit_code == 1


def test_workers_one_per_core_only_for_a_fleet_of_hundreds():
    assert worker_count(SPREAD_MIN - 1, cores=16) == 1
    assert worker_count(300, cores=1) == 1
    assert worker_count(1000, cores=2) == 2
    assert worker_count(1000, cores=64) == 7  # no worker for fewer than 128 hosts
    assert worker_count(100_000, cores=16) == 16


def _pids_started(directory: Path, count: int, proc: subprocess.Popen) -> list[int]:
    """The pids of the hosts' commands, each written as a file once it ran, polled for with a deadline."""
    end = time.monotonic() + 120
    while len(found := [p for p in directory.iterdir() if not p.name.endswith(".tmp")]) < count:
        assert proc.poll() is None and time.monotonic() < end, (len(found), proc.communicate())
        time.sleep(0.1)  # polling interval while the commands start, not a synchronisation sleep
    return [int(p.name) for p in found]


@pytest.mark.parametrize(("sig", "group", "code", "said"), [
    (signal.SIGTERM, False, 143, "gpurig: terminated (SIGTERM)"),  # kill PID, timeout, a CI runner: the parent alone hears it
    (signal.SIGINT, True, 130, "gpurig: interrupted"),  # Ctrl-C: the terminal signals the whole process group
])
def test_a_signal_stops_every_workers_commands_and_the_report_lists_every_host(tmp_path, sig, group, code, said):
    count = SPREAD_MIN + 44
    (tmp_path / "hosts.yaml").write_text("all:\n  hosts:\n" + "".join(f"    l{i:03d}: {{ansible_connection: local}}\n" for i in range(count)))
    started = tmp_path / "started"
    started.mkdir()
    line = f"echo $PPID > {started}/$$.tmp && mv {started}/$$.tmp {started}/$$ && exec sleep 600"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "COLUMNS": "120"}
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from gpurig.cli import main; main(sys.argv)", "exec", "-i", "hosts.yaml",
                             "-f", str(count), "--json", "report.json", "--", line], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    pids: list[int] = []
    try:
        pids = _pids_started(started, count, proc)
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in pids:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == code, stderr
    assert stderr.strip().splitlines()[-1] == said
    assert [pid for pid in pids if running(pid)] == []  # every worker's commands were stopped, none left behind
    workers = {int((started / str(pid)).read_text()) for pid in pids}
    if worker_count(count) > 1:
        assert len(workers) == worker_count(count) and proc.pid not in workers
    else:  # one core: no worker is forked, gpurig's own process ran every host
        assert workers == {proc.pid}
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["interrupted"] is True and [h["host"] for h in doc["hosts"]] == [f"l{i:03d}" for i in range(count)]
    assert {h["status"] for h in doc["hosts"]} == {"failed"} and all("interrupted" in h["reason"] for h in doc["hosts"])
    assert [w for w in workers if running(w)] == []  # the workers ended with the run

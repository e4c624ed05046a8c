"""The fleet runner with local hosts: statuses, bounded concurrency, reports, exit codes."""

from __future__ import annotations

import io
import json
import threading
import time

from rich.console import Console

from gpurig.connect.connector import Connector
from gpurig.connect.fleet import run_fleet
from gpurig.connect.ssh import SSHSettings
from gpurig.inventory import Host
from gpurig.report.fleetrun import FleetProgress, PlainProgress, print_recap
from gpurig.results import Outcome
from gpurig.status import Status


def hosts(n: int) -> list[Host]:
    return [Host(name=f"l{i}", groups=("ungrouped",), vars={}, address="localhost", connection="local") for i in range(n)]


def connector(tmp_path) -> Connector:
    return Connector(SSHSettings(project_known_hosts=tmp_path / "kh", user_known_hosts=None, ssh_config=None))


def test_statuses_summary_and_exit_code(tmp_path):
    def work(conn):
        n = conn.name
        if n == "l0":
            conn.run("exit 3")
        if n == "l1":
            raise ZeroDivisionError("bug")
        if n == "l2":
            return Outcome(changed=True, data={"x": 1}, detail="wrote it")
        return conn.run("echo hi").stdout

    report = run_fleet(hosts(5), work, connector=connector(tmp_path), report_path=tmp_path / "out" / "report.json")
    by = report.by_host()
    assert by["l0"].status == "failed" and "exited 3" in by["l0"].reason
    assert by["l1"].status == "failed" and "internal error: ZeroDivisionError: bug" in by["l1"].reason
    assert by["l2"].status == "changed" and by["l2"].data == {"x": 1}
    assert by["l3"].status == "ok" and by["l3"].data == "hi\n"
    assert report.summary == {"ok": 2, "changed": 1, "failed": 2, "unreachable": 0, "skipped": 0}
    assert report.exit_code == 1
    assert [r.host for r in report.results] == ["l0", "l1", "l2", "l3", "l4"]  # inventory order, not finish order
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["summary"] == report.summary and saved["hosts"][2]["data"] == {"x": 1}
    assert not list((tmp_path / "out").glob(".*tmp"))


def test_all_ok_exits_zero(tmp_path):
    assert run_fleet(hosts(3), lambda c: None, connector=connector(tmp_path)).exit_code == 0


def test_forks_hosts_run_at_once_and_no_more(tmp_path):
    """Lower bound: each host waits at a barrier that opens only when ``forks`` hosts are in their work together,
    so a fleet that ran fewer at a time (one host after another) breaks the barrier and fails every host.
    Upper bound: never more than ``forks`` inside their work at once."""
    forks = 3
    together = threading.Barrier(forks, timeout=20)  # bounded: a serial fleet fails in 20 s, never hangs
    running = 0
    peak = 0
    lock = threading.Lock()

    def work(conn):
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        try:
            together.wait()
            return conn.run("true").exited
        finally:
            with lock:
                running -= 1

    report = run_fleet(hosts(4 * forks), work, connector=connector(tmp_path), forks=forks)
    assert report.summary["ok"] == 4 * forks, [(r.host, r.reason) for r in report.results if not r.succeeded]
    assert peak == forks


def test_without_forks_every_host_of_a_small_fleet_runs_at_once(tmp_path):
    together = threading.Barrier(5, timeout=20)
    report = run_fleet(hosts(5), lambda conn: together.wait(), connector=connector(tmp_path))
    assert report.exit_code == 0, [(r.host, r.reason) for r in report.results]


def test_recap_gives_each_failed_host_one_reason_line_and_one_count_line(tmp_path):
    report = run_fleet(hosts(2), lambda c: c.run("exit 1"), connector=connector(tmp_path))
    buf = io.StringIO()
    print_recap(report, Console(file=buf, width=200))
    lines = buf.getvalue().splitlines()
    mine = [line for line in lines if "l0" in line]
    assert len(mine) == 2
    assert mine[0].startswith("failed      l0: command") and "exited 1" in mine[0]
    assert mine[1] == "l0 : ok=0 changed=0 unreachable=0 failed=1 skipped=0"
    assert "failed=2" in lines[-1]


def test_skipped_hosts_succeed_and_are_counted(tmp_path):
    report = run_fleet(hosts(2), lambda c: Outcome(status=Status.SKIPPED, detail="check mode"), connector=connector(tmp_path))
    assert report.summary["skipped"] == 2 and report.exit_code == 0
    assert report.results[0].reason == "check mode"


def test_a_failed_outcome_keeps_its_data(tmp_path):
    report = run_fleet(hosts(1), lambda c: Outcome(status=Status.FAILED, data={"rc": 3}, detail="exited 3"), connector=connector(tmp_path))
    assert report.results[0].status == "failed" and report.results[0].data == {"rc": 3}
    assert report.exit_code == 1


def test_progress_on_a_terminal_prints_each_host_as_it_finishes(tmp_path):
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=160)
    run_fleet(hosts(3), lambda c: c.run("exit 1") if c.name == "l1" else None, connector=connector(tmp_path), events=FleetProgress(console))
    text = buf.getvalue()
    assert "l0" in text and "l2" in text
    assert "failed" in text and "exited 1" in text


class _Watched(io.StringIO):
    """A log file that says when a line containing ``wanted`` was written to it."""

    def __init__(self, wanted: str) -> None:
        super().__init__()
        self.wanted, self.seen = wanted, threading.Event()

    def write(self, text: str) -> int:
        if self.wanted in text:
            self.seen.set()
        return super().write(text)


def test_without_a_terminal_a_long_run_prints_a_plain_line_at_a_steady_pace_saying_who_is_still_running(tmp_path):
    log = _Watched("1 of 2 hosts done (ok=1), running: l0")
    events = PlainProgress(Console(file=log, width=200), every=0.02)

    def work(conn):
        if conn.name == "l0":  # the long host: done once the log has said it is the one still running
            assert log.seen.wait(20), log.getvalue()

    report = run_fleet(hosts(2), work, connector=connector(tmp_path), events=events, label="rollout batch 1")
    assert [r.status for r in report.results] == [Status.OK, Status.OK]
    assert "rollout batch 1: 1 of 2 hosts done (ok=1), running: l0, " in log.getvalue()
    assert "\x1b" not in log.getvalue()  # plain text for a log: no bar, no colour codes
    assert not events._ticker.is_alive()  # the line stops with the run


def test_without_a_terminal_a_short_run_prints_no_progress_line(tmp_path):
    log = io.StringIO()
    run_fleet(hosts(2), lambda conn: None, connector=connector(tmp_path), events=PlainProgress(Console(file=log, width=200)))
    assert log.getvalue() == ""


def test_ctrl_c_as_the_run_starts_is_an_interrupted_run_not_a_crash(tmp_path):
    import pytest

    from gpurig.results import FleetEvents, FleetInterrupted

    class CtrlCAtStart(FleetEvents):
        def start(self, total: int, label: str) -> None:
            raise KeyboardInterrupt  # the person's Ctrl-C before the hosts are all handed out

    began = time.monotonic()
    with pytest.raises(FleetInterrupted) as stop:
        run_fleet(hosts(2), lambda c: None, connector=connector(tmp_path), events=CtrlCAtStart())
    assert [(r.host, r.reason) for r in stop.value.report.results] == [("l0", "interrupted"), ("l1", "interrupted")]
    assert stop.value.exit_code == 130
    assert time.monotonic() - began < 5  # no host began, so nothing is waited for (it waited out the 15 s stop grace)


def test_ctrl_c_while_the_hosts_are_handed_out_keeps_what_a_started_host_did_and_starts_no_other(tmp_path, monkeypatch):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import pytest

    from gpurig.connect import fleet
    from gpurig.results import FleetInterrupted

    began, ran = threading.Event(), []
    submit = ThreadPoolExecutor.submit

    def submit_then_ctrl_c(pool, fn, *args):
        submit(pool, fn, *args)
        assert began.wait(20)
        raise KeyboardInterrupt  # as submit returns: whatever it returned is lost to the caller

    def work(conn):
        ran.append(conn.name)
        began.set()
        return "did it"

    monkeypatch.setattr(fleet.ThreadPoolExecutor, "submit", submit_then_ctrl_c)
    with pytest.raises(FleetInterrupted) as stop:
        run_fleet(hosts(3), work, connector=connector(tmp_path))
    results = {r.host: (r.status, r.reason, r.data) for r in stop.value.report.results}
    assert results["l0"] == (Status.OK, "", "did it")  # found, although the Ctrl-C came before every host was handed out
    assert stop.value.report.duration_s < 5  # the hosts not begun are not waited for
    assert results["l1"][1] == results["l2"][1] == "interrupted"
    assert ran == ["l0"]

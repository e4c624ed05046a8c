"""The fleet runner with local hosts: statuses, bounded concurrency, reports, exit codes."""

from __future__ import annotations

import io
import json
import threading

from rich.console import Console

from gpurig.ssh import Connector, SSHSettings
from gpurig.fleet import Outcome, print_summary, run_fleet
from gpurig.inventory import Host


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
    assert report.summary == {"ok": 2, "changed": 1, "failed": 2, "unreachable": 0}
    assert report.exit_code == 1
    assert [r.host for r in report.results] == ["l0", "l1", "l2", "l3", "l4"]  # inventory order, not finish order
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["summary"] == report.summary and saved["hosts"][2]["data"] == {"x": 1}
    assert not list((tmp_path / "out").glob(".*tmp"))


def test_all_ok_exits_zero(tmp_path):
    assert run_fleet(hosts(3), lambda c: None, connector=connector(tmp_path)).exit_code == 0


def test_forks_bounds_concurrency(tmp_path):
    running = 0
    peak = 0
    lock = threading.Lock()

    def work(conn):
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        conn.run("sleep 0.05")
        with lock:
            running -= 1

    run_fleet(hosts(12), work, connector=connector(tmp_path), forks=3)
    assert peak <= 3


def test_summary_names_each_failed_host_once(tmp_path):
    report = run_fleet(hosts(2), lambda c: c.run("exit 1"), connector=connector(tmp_path))
    buf = io.StringIO()
    print_summary(report, Console(file=buf, width=200))
    text = buf.getvalue()
    assert text.count("l0") == 1 and "failed=2" in text


def test_progress_on_a_terminal_prints_each_host_as_it_finishes(tmp_path):
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=160)
    run_fleet(hosts(3), lambda c: c.run("exit 1") if c.name == "l1" else None, connector=connector(tmp_path), console=console)
    text = buf.getvalue()
    assert "l0" in text and "l2" in text
    assert "failed" in text and "exited 1" in text

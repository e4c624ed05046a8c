"""The verify history: one line per host per run, appended whole, bounded, read back past a torn line, shown by the dashboard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpurig.dashboard.history import read_history
from gpurig.verify import verdictlog
from gpurig.verify.records import HostVerdict, Record
from gpurig.verify.verdictlog import FLEET, VERIFY_LOG, append_entries, fleet_entry, read_verify_history, unverified_entry, verdict_entry


def _verdict(host="gpu01", status="fail"):
    return HostVerdict(host, (Record("host", "host.driver", "pass", "570.86", ">= 550"),
                              Record("host", "host.gpu0.ecc", status, 3, 0, "", "3 uncorrectable ECC errors", "drain and RMA the GPU"),
                              Record("container", "matmul.bf16", "warn", 600.0, 989.0, "TFLOP/s", "61% of peak", "check clocks")),
                       level="full", target="image pytorch:2.9")


def test_a_verdict_becomes_one_line_with_its_failing_and_warning_records_and_their_fixes(tmp_path):
    append_entries(tmp_path, [verdict_entry(_verdict(), time="2026-01-02T03:04:05+00:00")])
    lines = (tmp_path / VERIFY_LOG).read_text().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["host"] == "gpu01" and entry["level"] == "full" and entry["target"] == "image pytorch:2.9"
    assert entry["worst"] == "fail" and entry["passed"] is False and entry["gpurig"]
    assert [(r["id"], r["status"], r["fix"]) for r in entry["records"]] == [
        ("host.gpu0.ecc", "fail", "drain and RMA the GPU"), ("matmul.bf16", "warn", "check clocks")]
    assert entry["records"][0]["measured"] == 3 and entry["records"][0]["expected"] == 0
    assert entry["figures"].startswith("bf16 600 TFLOP/s")


def test_runs_append_and_the_reader_filters_by_host_and_time(tmp_path):
    append_entries(tmp_path, [verdict_entry(_verdict("a"), time="2026-01-01T00:00:00+00:00"),
                              unverified_entry("b", "quick", "", "unreachable", "connection refused", time="2026-01-01T00:00:00+00:00")])
    append_entries(tmp_path, [verdict_entry(_verdict("a", "pass"), time="2026-01-02T00:00:00+00:00")])
    found = read_verify_history(tmp_path)
    assert [(e["host"], e["worst"]) for e in found.entries] == [("a", "fail"), ("b", "unreachable"), ("a", "warn")]
    assert [e["worst"] for e in read_verify_history(tmp_path, host="a", since="2026-01-01T12:00:00+00:00").entries] == ["warn"]
    assert read_verify_history(tmp_path, host="b").entries[0]["reason"] == "connection refused"


def test_a_torn_last_line_is_skipped_and_the_next_run_still_appends_whole_lines(tmp_path):
    append_entries(tmp_path, [verdict_entry(_verdict())])
    with open(tmp_path / VERIFY_LOG, "a") as fh:
        fh.write('{"schema": "gpurig.verify-history/1", "host": "gpu0')  # killed mid-write
    assert len(read_verify_history(tmp_path).entries) == 1
    append_entries(tmp_path, [verdict_entry(_verdict("gpu02"))])  # the torn line is ended first, so this one reads whole
    assert [e["host"] for e in read_verify_history(tmp_path).entries] == ["gpu01", "gpu02"]


def test_the_file_is_bounded_by_rotation(tmp_path, monkeypatch):
    monkeypatch.setattr(verdictlog, "MAX_BYTES", 2000)
    for n in range(40):
        append_entries(tmp_path, [verdict_entry(_verdict(f"h{n}"))])
    log = tmp_path / VERIFY_LOG
    assert log.stat().st_size <= 2000 + 1000 and log.with_name("verify.jsonl.1").stat().st_size <= 2000 + 1000
    hosts = [e["host"] for e in read_verify_history(tmp_path).entries]
    assert hosts[-1] == "h39" and "h0" not in hosts and hosts == sorted(hosts, key=lambda h: int(h[1:]))


def test_no_environment_token_or_key_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("GPURIG_TOKEN", "s3cr3t-token-value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "AKIAsecretkeyvalue")
    append_entries(tmp_path, [verdict_entry(_verdict()), unverified_entry("b", "quick", "", "failed", "sudo: a password is required")])
    text = (tmp_path / VERIFY_LOG).read_text()
    assert "s3cr3t" not in text and "AKIA" not in text and "PATH" not in text and "HOME" not in text
    keys = {k for line in text.splitlines() for k in json.loads(line)}
    assert keys <= {"schema", "time", "host", "hosts", "level", "target", "worst", "passed", "records", "more_records", "figures",
                    "reason", "fix", "gpurig"}


def test_an_unreadable_file_is_named_with_why(tmp_path):
    (tmp_path / ".gpurig" / "history").mkdir(parents=True)
    os.symlink("/etc/passwd", tmp_path / VERIFY_LOG)
    found = read_verify_history(tmp_path)
    assert not found.entries and found.unread and "regular file" in found.unread[0]["why"]


def test_a_fabric_run_fits_as_one_entry_for_the_fleet_naming_its_hosts(tmp_path):
    records = [Record("fabric", "fabric.allreduce", "fail", 12.0, 180.0, "GB/s", "gpu02's NIC at 1/15 of the rest", "reseat the cable")]
    append_entries(tmp_path, [fleet_entry(["gpu01", "gpu02"], "fabric", records, time="2026-01-03T00:00:00+00:00")])
    (entry,) = read_verify_history(tmp_path, host="gpu02").entries
    assert entry["host"] == FLEET and entry["hosts"] == ["gpu01", "gpu02"] and entry["worst"] == "fail" and entry["passed"] is False
    found = read_history(tmp_path)
    (shown,) = [e for e in found.entries if e["kind"] == "verify"]
    assert shown["hosts"] == ["gpu01", "gpu02"] and "fabric.allreduce" in shown["reason"]
    assert found.verdicts == {}  # a fleet entry is no one host's verdict


def test_the_dashboard_takes_the_newest_of_verify_runs_and_rollouts(tmp_path):
    rollouts = tmp_path / ".gpurig" / "rollouts"
    rollouts.mkdir(parents=True)
    state = {"hosts": {"gpu01": {"host": "gpu01", "state": "done", "verify": "passed", "level": "quick", "time": "2026-01-01T00:00:00+00:00",
                                 "image_ref": "pytorch:1"}}}
    (rollouts / "gpu-pytorch.json").write_text(json.dumps(state))
    append_entries(tmp_path, [verdict_entry(_verdict(), time="2026-01-05T00:00:00+00:00")])
    found = read_history(tmp_path)
    assert not found.unread, found.unread
    assert found.verdicts["gpu01"]["verdict"] == "failed" and found.verdicts["gpu01"]["source"].startswith("verify run")
    assert "host.gpu0.ecc" in found.verdicts["gpu01"]["reason"]
    assert [e["kind"] for e in found.entries] == ["verify", "rollout"]


# ---- the real CLI: `gpurig verify` on this machine (no GPU here: the host level fails, and that is what the history keeps) ----

ROOT = Path(__file__).resolve().parents[3]


def _gpurig(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250", "HOME": str(cwd)}
    return subprocess.run([sys.executable, "-c", "from gpurig.cli import main; main()", *args], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def _project(tmp_path: Path) -> Path:
    (tmp_path / "gpurig.yaml").write_text("{}\n")
    (tmp_path / "hosts.yaml").write_text("all:\n  hosts:\n    here:\n      ansible_connection: local\n")
    return tmp_path


def test_a_verify_run_keeps_one_line_per_host_and_the_dashboard_shows_its_verdict(tmp_path):
    project = _project(tmp_path)
    proc = _gpurig(project, "verify", "-i", "hosts.yaml", "--json", "report.json")
    report = json.loads((project / "report.json").read_text())
    [host] = report["hosts"]
    [entry] = read_verify_history(project).entries
    assert entry["host"] == "here" and entry["level"] == "quick" and entry["target"] is None
    assert entry["passed"] is report["passed"] and (proc.returncode == 0) is entry["passed"], proc.stderr
    if not entry["passed"]:  # this machine's honest answer (no GPU, or no driver): the failing record with its fix
        assert entry["worst"] == "fail" and host["reason"].startswith(entry["records"][0]["id"])
        assert entry["records"][0]["fix"]
    found = read_history(project)
    assert found.verdicts["here"]["verdict"] == ("passed" if entry["passed"] else "failed")
    assert found.verdicts["here"]["source"].startswith("verify run")
    assert [e["kind"] for e in found.entries] == ["verify"]


def test_verify_under_dry_keeps_no_history(tmp_path):
    project = _project(tmp_path)
    _gpurig(project, "--dry", "verify", "-i", "hosts.yaml")
    assert not (project / ".gpurig").exists()

"""gpurig usage: GPU-hours allocated (job records) and used (monitor samples), figures computed by hand; --since; idle listing; the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpurig.errors import ConfigError
from gpurig.jobs.gpuhours import idle_spells, parse_since, parse_span, usage
from gpurig.jobs.views import job_view
from gpurig.monitor.record import load_run
from gpurig.monitor.session import Run

ROOT = Path(__file__).resolve().parents[3]
RUNS = ROOT / "tests" / "fixtures" / "monitor" / "runs"
T0 = 1_760_000_000.0
H = 3600.0


def _sample(t: float, gpus: list[dict]) -> dict:
    return {"type": "sample", "t": t, "cpu": {"percent": 1.0}, "gpus": gpus}


def _gpu(index: int, util: float, *, procs=(), jobs=(), users=()) -> dict:
    g: dict = {"index": index, "uuid": f"GPU-{index}", "util_gpu": util,
               "processes": [{"pid": pid, "user": user, "name": "python"} for pid, user in procs]}
    if jobs:
        g.update(hpc_jobs=list(jobs), hpc_users=list(users))
    return g


def _run(host: str, minutes: int, gpus_at) -> Run:
    run = Run()
    for m in range(minutes):
        run.add(host, _sample(T0 + 60 * m, gpus_at(m)))
    return run


def test_the_recorded_slurm_run_adds_up_as_computed_by_hand():
    # 30 samples 1 s apart (the last stands for the usual 1 s): GPU 0 at 2% held by job 42 (alice); GPU 1 at 97% shared by jobs
    # 43 (bob) and 44 (no user), each holding half of it; GPU 2 held by no one counts for no one.
    found = usage([], [load_run(RUNS / "slurm_jobs")], T0 - 1, T0 + 100, idle_after=1800)
    rows = {r.job: r for r in found.rows}
    assert set(rows) == {"42", "43", "44"} and found.samples == 30 and found.jobs == 0
    assert rows["42"].user == "alice" and rows["42"].allocated_s == pytest.approx(30) and rows["42"].used_s == pytest.approx(0.6)
    assert rows["43"].user == "bob" and rows["43"].allocated_s == pytest.approx(15) and rows["43"].used_s == pytest.approx(14.55)
    assert rows["44"].user == "?" and rows["44"].used_s == pytest.approx(14.55)
    [host] = found.totals("host")
    assert host.allocated_s == pytest.approx(60) and host.used_s == pytest.approx(29.7) and host.efficiency == pytest.approx(0.495)


def test_a_job_record_allocates_and_the_samples_of_its_gpus_are_its_use():
    # A gpurig job given GPU 0 ran the 2 h: GPU 0 at 50% -> 1.0 h used of 2.0 h allocated. On GPU 1 bob's process, in no
    # job record, at 100% for the 2 h: allocated the 2.0 h it held, all used.
    start, end = T0, T0 + 2 * H
    job = job_view("gpu01", {"id": "abc-1", "state": "succeeded", "devices": ["0"], "user": "alice",
                             "started_at": start, "ended_at": end, "submitted_at": start - 5})
    run = _run("gpu01", 120, lambda m: [_gpu(0, 50, procs=[(11, "root")]), _gpu(1, 100, procs=[(22, "bob")])])
    found = usage([job], [run], start, end, idle_after=1800)
    by_user = {u.user: u for u in found.totals("user")}
    assert by_user["alice"].allocated_s / H == pytest.approx(2.0) and by_user["alice"].used_s / H == pytest.approx(1.0)
    assert by_user["alice"].efficiency == pytest.approx(0.5)
    assert by_user["bob"].allocated_s / H == pytest.approx(2.0) and by_user["bob"].used_s / H == pytest.approx(2.0)
    assert "root" not in by_user  # the job's own process on GPU 0 is the job's, not a holder of its own
    assert [r.job for r in found.rows if r.user == "bob"] == ["pid 22 (python)"]


def test_only_the_part_of_a_job_inside_the_window_counts():
    # 4 GPUs for 3 h, of which the last 1 h lies in the window -> 4.0 GPU-h; a job that ended before the window is not read.
    now = T0 + 10 * H
    inside = job_view("h", {"id": "job-in", "state": "running", "gpus": {"count": 4}, "user": "carol", "started_at": now - 3 * H})
    before = job_view("h", {"id": "job-old", "state": "succeeded", "devices": ["0"], "started_at": T0, "ended_at": T0 + H})
    pending = job_view("h", {"id": "job-wait", "state": "pending", "gpus": {"count": 1}})
    found = usage([inside, before, pending], [], now - H, now, idle_after=1800)
    assert found.jobs == 1
    [row] = found.rows
    assert row.user == "carol" and row.gpus == 4 and row.allocated_s / H == pytest.approx(4.0) and row.efficiency == 0


def test_a_gap_in_the_samples_is_not_counted_as_use():
    # one sample, then nothing for an hour, then one more: the first stands for the usual interval, not the hour
    run = Run()
    for t in (T0, T0 + 60, T0 + 120, T0 + 3720):
        run.add("h", _sample(t, [_gpu(0, 100, procs=[(1, "dan")])]))
    [row] = usage([], [run], T0, T0 + 4000, idle_after=1800).rows
    assert row.held_s == pytest.approx(4 * 60)


@pytest.mark.parametrize(("text", "seconds"), [("90m", 5400), ("24h", 86400), ("7d", 7 * 86400), ("2w", 14 * 86400), ("30s", 30)])
def test_since_takes_a_span(text, seconds):
    assert parse_since(text, T0) == T0 - seconds


def test_since_takes_an_iso_date_in_utc_unless_it_says_otherwise():
    assert parse_since("2025-10-09", T0) == 1759968000.0
    assert parse_since("2025-10-09T08:00+02:00", T0) == 1759989600.0


@pytest.mark.parametrize("text", ["7", "7 days", "-3d", "0h", "yesterday", "2025-13-01", "2999-01-01", ""])
def test_since_refuses_anything_else_with_the_fix(text):
    with pytest.raises(ConfigError) as err:
        parse_since(text, T0)
    assert "7d" in err.value.fix


def test_idle_after_is_a_span():
    assert parse_span("30m", "--idle-after") == 1800
    with pytest.raises(ConfigError, match="--idle-after"):
        parse_span("soon", "--idle-after")


def test_a_gpu_held_under_5_percent_for_longer_than_idle_after_is_listed_with_its_holder():
    # GPU 0: job 7 (erin) at 2% for 40 min, then busy; GPU 1: 3% for 20 min only; GPU 2: 0% but held by no one
    def gpus(m):
        return [_gpu(0, 2 if m < 40 else 90, jobs=["7"], users=["erin"]), _gpu(1, 3 if m < 20 else 80, procs=[(5, "fred")]), _gpu(2, 0)]

    run = _run("h", 60, gpus)
    spells = idle_spells("h", run.series("h"), 30 * 60)
    assert [(s.gpu, s.holders, s.users, s.seconds) for s in spells] == [("0", "slurm job 7", "erin", 40 * 60)]
    assert [s.gpu for s in idle_spells("h", run.series("h"), 10 * 60)] == ["0", "1"]


# ---- the real CLI on this machine ----


# The local host's job records are this machine's /srv/gpurig/jobs, where a test running beside this one (the dashboard's
# jobs, run as root) may have jobs right now: as root, gpurig runs in a mount namespace of its own whose /srv is empty.
EMPTY_SRV = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount -t tmpfs none /srv && exec "$@"', "sh"]


def _gpurig(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80", "HOME": str(cwd)}
    alone = EMPTY_SRV if os.geteuid() == 0 and shutil.which("unshare") else []
    return subprocess.run([*alone, sys.executable, "-c", "from gpurig.cli import main; main()", *args], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


@pytest.fixture
def here(tmp_path: Path) -> Path:
    (tmp_path / "hosts.yaml").write_text("all:\n  hosts:\n    here:\n      ansible_connection: local\n")
    return tmp_path


def test_usage_of_a_recorded_run_through_the_cli(here):
    proc = _gpurig(here, "usage", "-i", "hosts.yaml", "--from-records", str(RUNS / "slurm_jobs"), "--since", "3650d",
                   "--idle-after", "10s", "--json", "usage.json", "--csv", "usage.csv")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), proc.stdout
    header = next(line for line in lines if line.startswith("user"))
    assert header.split() == ["user", "allocated", "h", "used", "h", "efficiency"]
    alice = next(line for line in lines if line.startswith("alice"))
    assert alice.split() == ["alice", "0.0083", "0.0002", "2%"]
    assert "slurm job 42" in proc.stdout and "0 job records and 30 samples from " in proc.stdout and proc.stdout.rstrip().endswith("UTC")
    doc = json.loads((here / "usage.json").read_text())
    assert doc["schema"] == "gpurig.usage/1" and doc["passed"] is True and doc["unasked"] == []
    users = {u["user"]: u for u in doc["users"]}
    assert users["alice"]["allocated_h"] == pytest.approx(30 / H, abs=1e-6) and users["alice"]["efficiency_pct"] == 2.0
    assert users["bob"]["used_h"] == pytest.approx(14.55 / H, abs=1e-6)
    [host] = doc["hosts"]
    assert host["host"] == "gpu-slurm-jobs" and host["efficiency_pct"] == 49.5
    assert [i["gpu"] for i in doc["idle"]] == ["0"]
    assert (here / "usage.csv").read_text().splitlines()[0].startswith("user,job,host,allocated_h")


def test_usage_of_a_window_with_nothing_in_it_says_so_and_fails(here):
    proc = _gpurig(here, "usage", "-i", "hosts.yaml", "--from-records", str(RUNS / "slurm_jobs"), "--since", "90m")
    assert proc.returncode == 1 and "nothing to count" in proc.stderr, proc.stderr


def test_a_bad_since_is_one_line_and_exit_2(here):
    proc = _gpurig(here, "usage", "-i", "hosts.yaml", "--since", "lastweek")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "--since" in line and "7d" in line


def test_a_host_that_could_not_be_asked_is_named_and_fails_the_run(here):
    (here / "hosts.yaml").write_text("all:\n  hosts:\n    here:\n      ansible_connection: local\n"
                                     "    gone:\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n")
    proc = _gpurig(here, "usage", "-i", "hosts.yaml", "--from-records", str(RUNS / "healthy"), "--since", "3650d", "--json", "-")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert [u["host"] for u in doc["unasked"]] == ["gone"] and doc["passed"] is False and doc["users"]

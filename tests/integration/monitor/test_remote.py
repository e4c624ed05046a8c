"""`invoke monitor` over SSH against real loopback sshd hosts, for a fixed duration, with one host dying mid-run."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from gpurig.monitor.record import load_run

from .conftest import SSHD

ROOT = Path(__file__).resolve().parents[3]
DURATION, INTERVAL = 6, 0.5

pytestmark = pytest.mark.skipif(SSHD is None or os.geteuid() != 0, reason="needs sshd and root (see tests/integration/hosts)")


def samples_per_host(path: Path) -> Counter:
    counts: Counter = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("type") == "sample":
                counts[record["host"]] += 1
    return counts


def test_monitor_remote_hosts_while_one_dies(farm, client_key, login_user, tmp_path):
    hosts = farm.start(3, prefix="mon")
    names = ["mon-a", "mon-b", "mon-c"]
    entries = {n: {"ansible_host": "127.0.0.1", "ansible_port": h.port} for n, h in zip(names, hosts)}
    entries["elsewhere"] = {"ansible_host": "127.0.0.1", "ansible_port": 1}  # left out by -l: never contacted
    inventory = tmp_path / "inventory" / "hosts.yaml"
    inventory.parent.mkdir()
    inventory.write_text(yaml.safe_dump({"all": {"vars": {"ansible_user": login_user, "ansible_ssh_private_key_file": str(client_key)}, "hosts": entries}}))
    rec, out_csv, report, png = tmp_path / "rec", tmp_path / "run.csv", tmp_path / "report.json", tmp_path / "run.png"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from gpurig.cli import main; main()", "monitor", "-i", str(inventory), "-l", "mon-*",
         "--duration", str(DURATION), "--interval", str(INTERVAL), "--csv", str(out_csv), "--record", str(rec), "--json", str(report), "--plot", str(png)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        end = time.monotonic() + 30
        while min(samples_per_host(rec / "samples.jsonl").get(n, 0) for n in names) < 2:
            assert proc.poll() is None, proc.communicate(timeout=60)
            assert time.monotonic() < end, "no samples from every host within 30 s"
            time.sleep(0.05)  # polling the recorded run for progress, not a synchronisation sleep
        farm.kill(hosts[1])  # mon-b dies mid-run
        killed_at = time.time()
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr
    failure = [line for line in stderr.splitlines() if "mon-b" in line and "failed" in line]
    assert failure and "connection lost" in failure[0], stderr
    assert "elsewhere" not in stderr + stdout

    run = load_run(rec)
    assert run.hosts() == names
    expected = DURATION / INTERVAL
    for name in ("mon-a", "mon-c"):  # the others went on to the end
        series = run.series(name)
        assert len(series) >= expected - 2, (name, len(series))
        assert series[-1].t > killed_at + 1
        assert run.state(name).source == "none" and len(run.state(name).notes) == 1
        assert all(len(s.per_core) == os.cpu_count() and s.mem_total > 0 for s in series)
    assert 2 <= len(run.series("mon-b")) < expected - 2
    # One note line for the three GPU-less hosts, not one per host or per sample.
    assert sum("no NVIDIA driver found" in line for line in stderr.splitlines()) == 1

    rows = list(csv.DictReader(io.StringIO(out_csv.read_text()), skipinitialspace=True))
    assert Counter(r["hostname"] for r in rows) == Counter({n: len(run.series(n)) for n in names})
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    statuses = {h["host"]: h["status"] for h in json.loads(report.read_text())["fleet"]["hosts"]}
    assert statuses == {"mon-a": "ok", "mon-b": "failed", "mon-c": "ok"}

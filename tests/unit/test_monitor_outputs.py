"""What a monitoring run turns into: CSV, diagnosis, a recorded run read back, the plot, the exporter's families, the view."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest
from rich.console import Console

from gpurig.monitor import MonitorError
from gpurig.monitor.csvfile import HEADER, CsvWriter
from gpurig.monitor.diagnose import diagnose
from gpurig.monitor.exporter import RunCollector, parse_listen
from gpurig.monitor.live import findings_view, live_table
from gpurig.monitor.plot import PANELS, plot
from gpurig.monitor.record import Recorder, load_run
from gpurig.monitor.samples import GpuSample, Sample
from gpurig.monitor.session import Run

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "tests" / "fixtures" / "monitor" / "runs"
CASES = ("input_bound", "small_kernels", "oom_risk", "throttling", "waiting", "contention")


@pytest.mark.parametrize("case", CASES)
def test_each_diagnosis_rule_fires_on_its_case_alone(case):
    findings = diagnose(load_run(RUNS / case))
    assert [f.rule for f in findings] == [case]
    f = findings[0]
    assert f.host == f"gpu-{case.replace('_', '-')}" and f.gpu == 0
    assert re.search(r"\d+%", f.evidence), f.evidence  # evidence quotes figures, not just a verdict
    assert f.fix


def test_a_healthy_run_has_no_finding():
    assert diagnose(load_run(RUNS / "healthy")) == []


def test_fixes_name_the_knobs_users_turn():
    fixes = {f.rule: f.fix for case in CASES for f in diagnose(load_run(RUNS / case))}
    assert "num_workers" in fixes["input_bound"] and "pin_memory" in fixes["input_bound"]
    for knob in ("batch size", "AMP", "CUDA graphs", "torch.compile"):
        assert knob in fixes["small_kernels"]
    assert "cooling" in fixes["throttling"]


def gpu_sample(**kw):
    return GpuSample(**{"index": 0, "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-1", "util_gpu": 97, "mem_used_mib": 1000, "mem_total_mib": 81920, **kw})


def test_csv_has_nvidia_smi_names_units_na_and_quoting(tmp_path):
    out = tmp_path / "run.csv"
    writer = CsvWriter(out)
    gpus = (gpu_sample(throttle=0x44, power_w=385.125, name='Odd "GPU", rev 2'), gpu_sample(index=1, util_gpu=None, power_w=None))
    writer("h1", {}, Sample("h1", 1_700_000_000.25, 12.5, (20.0, 5.0), mem_total=2 * 2**30, mem_available=2**30, gpus=gpus))
    writer("h2", {}, Sample("h2", 1_700_000_001.0, 3.0, (3.0,), mem_total=2**30, mem_available=2**29))
    assert not out.exists()  # nothing half-written: the file appears when the run ends
    writer.close()
    text = out.read_text()
    assert text.splitlines()[0].startswith(
        "timestamp, hostname, index, name, uuid, pci.bus_id, utilization.gpu [%], utilization.memory [%], "
        "memory.used [MiB], memory.total [MiB], temperature.gpu, power.draw [W]"
    )
    rows = list(csv.DictReader(io.StringIO(text), skipinitialspace=True))
    assert [r["hostname"] for r in rows] == ["h1", "h1", "h2"]
    assert rows[0]["name"] == 'Odd "GPU", rev 2'
    assert rows[0]["power.draw [W]"] == "385.12" and rows[0]["utilization.gpu [%]"] == "97"
    assert rows[0]["clocks_throttle_reasons.active"] == "0x0000000000000044"
    assert rows[1]["utilization.gpu [%]"] == "[N/A]" and rows[1]["power.draw [W]"] == "[N/A]"
    assert rows[2]["index"] == "[N/A]" and rows[2]["host.cpu [%]"] == "3.0" and rows[2]["host.memory.used [MiB]"] == "512"
    assert re.fullmatch(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.250", rows[0]["timestamp"])
    assert list(rows[0]) == list(HEADER)


def test_recorded_run_reads_back_and_skips_a_torn_last_line(tmp_path):
    rec = Recorder(tmp_path / "rec")
    run = Run((rec,))
    for line in (RUNS / "oom_risk" / "samples.jsonl").read_text().splitlines()[:6]:
        record = json.loads(line)
        run.add("renamed", {k: v for k, v in record.items() if k != "host"})
    rec.close({"interval": 1})
    with open(tmp_path / "rec" / "samples.jsonl", "a") as fh:
        fh.write('{"type":"sample","t":1')  # killed mid-write
    back = load_run(tmp_path / "rec")
    assert back.hosts() == ["renamed"]
    assert back.series("renamed") == run.series("renamed") and len(back.series("renamed")) == 5
    assert back.state("renamed").source == "nvml"
    with pytest.raises(MonitorError, match="already holds a recorded run"):
        Recorder(tmp_path / "rec")
    with pytest.raises(MonitorError, match="no recorded run in"):
        load_run(tmp_path / "nothing")


def test_plot_draws_four_panels_per_host(tmp_path):
    run = load_run(RUNS / "healthy")
    for line in (RUNS / "input_bound" / "samples.jsonl").read_text().splitlines():
        record = json.loads(line)
        run.add(record.pop("host"), record)
    titles = plot(run, tmp_path / "run.png")
    assert titles == [f"{h}: {p}" for h in ("gpu-healthy", "gpu-input-bound") for p in PANELS]
    image = matplotlib.image.imread(tmp_path / "run.png")
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert image.shape[0] > 300 and image.shape[1] > 1000  # two rows of four panels
    with pytest.raises(MonitorError, match="nothing to plot"):
        plot(Run(), tmp_path / "empty.png")


def test_collector_uses_dcgm_names_and_labels_and_node_exporter_names():
    families = {f.name: f for f in RunCollector(load_run(RUNS / "small_kernels")).collect()}
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples[0]
    assert util.labels == {
        "gpu": "0",
        "UUID": "GPU-2f1c4e8a-9b7d-4c3e-8f21-5a6b7c8d9e0f",
        "pci_bus_id": "00000000:07:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "gpu-small-kernels",
    }
    assert util.value == 96
    assert families["DCGM_FI_PROF_SM_ACTIVE"].samples[0].value < 0.5
    assert families["DCGM_FI_DEV_FB_USED"].samples[0].value == 48 * 1024
    cpu = families["node_cpu_seconds"]
    assert cpu.type == "counter" and {s.labels["mode"] for s in cpu.samples} == {"user", "system", "idle", "iowait"}
    assert families["node_memory_MemTotal_bytes"].samples[0].value == 512 * 2**30


def test_a_silent_host_drops_out_of_the_exporter():
    run = load_run(RUNS / "healthy")
    last = run.series("gpu-healthy")[-1].t
    fresh = {f.name: f for f in RunCollector(run, stale_after=10, clock=lambda: last + 5).collect()}
    stale = {f.name: f for f in RunCollector(run, stale_after=10, clock=lambda: last + 60).collect()}
    assert fresh["DCGM_FI_DEV_GPU_UTIL"].samples and not stale["DCGM_FI_DEV_GPU_UTIL"].samples


def test_listen_address():
    assert parse_listen("9400") == ("127.0.0.1", 9400)
    assert parse_listen("0.0.0.0:9400") == ("0.0.0.0", 9400)
    assert parse_listen("[::1]:9400") == ("::1", 9400)
    with pytest.raises(MonitorError, match="is not \\[ADDR:\\]PORT"):
        parse_listen("localhost:http")


def test_live_view_and_diagnosis_fit_80_columns():
    run = load_run(RUNS / "contention")
    latest = {**run.latest(), "a-very-long-hostname-01.example.org": Sample("x", 0, 50.0, (99.0,), mem_total=2**34, mem_available=2**33)}
    con = Console(width=80, record=True, color_system=None)
    con.print(live_table(latest, failed={"dead-host": "connection lost"}))
    con.print(findings_view(diagnose(run)))
    lines = con.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines)
    table = "\n".join(lines)
    assert "gpu-contention" in table and "71/80" in table and "connection lost" in table
    assert "bob (pid 7331" in " ".join(table.split())


def gpurig(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's gpurig, whatever is installed
    return subprocess.run([sys.executable, "-c", "from gpurig.cli import main; main()", *args], capture_output=True, text=True, cwd=cwd, timeout=120, env=env)


def test_cli_replays_a_recorded_run_into_plot_csv_json(tmp_path):
    proc = gpurig("monitor", "--replay", str(RUNS / "input_bound"), "--plot", "p.png", "--csv", "r.csv", "--json", "r.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[input_bound]" in proc.stdout and "num_workers" in proc.stdout
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 31
    report = json.loads((tmp_path / "r.json").read_text())
    assert [f["rule"] for f in report["findings"]] == ["input_bound"]
    assert report["hosts"]["gpu-input-bound"]["samples"] == 30
    to_stdout = gpurig("monitor", "--replay", str(RUNS / "oom_risk"), "--json", "-", cwd=tmp_path)
    assert json.loads(to_stdout.stdout)["findings"][0]["rule"] == "oom_risk"  # the tables went to stderr
    assert "[oom_risk]" in to_stdout.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (("--interval", "fast"), "--interval 'fast' is not a number of seconds from 0.05 to 31622400; fix:"),
        (("--replay", "nowhere"), "no recorded run in nowhere"),
        (("--prometheus", "x:y", "-i", "inv.yaml"), "--prometheus 'x:y' is not [ADDR:]PORT"),
    ],
)
def test_cli_bad_input_is_one_line(tmp_path, args, message):
    (tmp_path / "inv.yaml").write_text("all:\n  hosts:\n    here:\n      ansible_connection: local\n")
    proc = gpurig("monitor", *args, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_exporter_answers_plain_gzip_404_and_a_burst_of_scrapers():
    import asyncio
    import gzip
    import urllib.error
    import urllib.request

    from gpurig.monitor.exporter import serve

    exporter = serve(load_run(RUNS / "healthy"), "127.0.0.1", 0)
    try:
        plain = urllib.request.urlopen(exporter.url, timeout=10).read().decode()
        util = [line for line in plain.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
        assert len(util) == 1 and 'Hostname="gpu-healthy"' in util[0] and util[0].endswith("} 97.0")
        asked = urllib.request.Request(exporter.url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(asked, timeout=10) as resp:
            assert resp.headers["Content-Encoding"] == "gzip"
            assert gzip.decompress(resp.read()).decode() == plain
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(exporter.url.replace("/metrics", "/other"), timeout=10)

        async def scrape() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", exporter.port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip\r\n\r\n")
            data = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            return data

        async def burst() -> list[bytes]:
            return await asyncio.gather(*(scrape() for _ in range(100)))

        answers = asyncio.run(burst())  # socketserver's backlog of 5 used to leave most of these hanging
        assert all(a.startswith(b"HTTP/1.0 200 OK") for a in answers)
    finally:
        exporter.close()


def test_cli_refusing_to_start_leaves_no_file(tmp_path):
    import socket

    (tmp_path / "inv.yaml").write_text("all:\n  hosts:\n    here:\n      ansible_connection: local\n")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "samples.jsonl").write_text("")
    proc = gpurig("monitor", "-i", "inv.yaml", "--csv", "run.csv", "--record", "old", cwd=tmp_path)
    assert proc.returncode == 2 and "old already holds a recorded run" in proc.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        proc = gpurig("monitor", "-i", "inv.yaml", "--csv", "run.csv", "--record", "new", "--prometheus", str(busy.getsockname()[1]), cwd=tmp_path)
    assert proc.returncode == 2 and "cannot listen on 127.0.0.1:" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inv.yaml", "old"]  # no CSV, no .part, no run directory


def steady_run(util_gpu: float, per_core: list[float], n: int = 6) -> Run:
    """The input_bound fixture's host for ``n`` one-second samples, every one with this GPU utilisation and these cores."""
    hello, first = (json.loads(line) for line in (RUNS / "input_bound" / "samples.jsonl").read_text().splitlines()[:2])
    run = Run()
    run.add(hello["host"], hello)
    for i in range(n):
        rec = json.loads(json.dumps(first))
        rec["t"] += i
        rec["cpu"]["per_core"], rec["cpu"]["percent"] = per_core, sum(per_core) / len(per_core)
        rec["gpus"][0]["util_gpu"] = util_gpu
        run.add(hello["host"], rec)
    return run


@pytest.mark.parametrize("busiest, found", [(90.0, True), (89.9, False)])
def test_input_bound_from_a_busiest_core_at_90_percent(busiest, found):
    findings = diagnose(steady_run(5, [busiest, 12.0, 8.0, 10.0]))
    assert [f.rule for f in findings] == (["input_bound"] if found else [])
    if found:
        assert "while one CPU core was at >= 90% in 100% of those (busiest core mean 90%" in findings[0].evidence


@pytest.mark.parametrize("util, found", [(29.9, True), (30.0, False)])
def test_a_gpu_is_idle_under_30_percent_utilisation(util, found):
    # the same threshold for both rules that need an idle GPU: a saturated core (input-bound) and a quiet CPU (waiting)
    for cores, rule in (([95.0, 12.0, 8.0, 10.0], "input_bound"), ([10.0, 5.0, 5.0, 5.0], "waiting")):
        findings = diagnose(steady_run(util, cores))
        assert [f.rule for f in findings] == ([rule] if found else []), cores
        if found:
            assert "under 30% utilisation (NVML utilization.gpu) in 100% of" in findings[0].evidence

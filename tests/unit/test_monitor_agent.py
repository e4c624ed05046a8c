"""checks/gpu_sampler.py: the no-driver path for real, the nvidia-smi fallback and NVML parsing on recorded formats."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from nvml_replay import FakeNvml, sampler

from gpurig.connect.local import LocalConnection
from gpurig.errors import HostError
from gpurig.monitor.agent import LineBuffer, agent_command, watch
from gpurig.monitor.session import Run

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "checks" / "gpu_sampler.py"
FIXTURES = ROOT / "tests" / "fixtures" / "monitor"


def run_agent(*args, env=None):
    proc = subprocess.run([sys.executable, str(AGENT), *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_without_a_driver_it_samples_cpu_and_memory_and_says_so_once():
    records = run_agent("--interval", "0.05", "--count", "3")
    kinds = [r["type"] for r in records]
    assert kinds == ["hello", "note", "sample", "sample", "sample", "end"]
    assert records[0]["source"] == "none"
    assert "no NVIDIA driver found" in records[1]["message"] and "CPU and memory only" in records[1]["message"]
    for s in records[2:5]:
        assert s["gpus"] == []
        assert len(s["cpu"]["per_core"]) == os.cpu_count()
        assert all(0 <= c <= 100 for c in s["cpu"]["per_core"])
        assert s["mem"]["total"] == psutil.virtual_memory().total
        assert 0 < s["mem"]["used"] < s["mem"]["total"]


def test_without_psutil_proc_gives_the_same_record_shape(tmp_path):
    (tmp_path / "psutil.py").write_text("raise ImportError('hidden for this test')\n")
    records = run_agent("--interval", "0.05", "--count", "2", env={"PYTHONPATH": str(tmp_path)})
    assert records[0]["psutil"] is False
    sample = records[-2]
    assert len(sample["cpu"]["per_core"]) == os.cpu_count()
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    assert sample["mem"]["total"] == int(meminfo["MemTotal"].split()[0]) * 1024
    assert set(sample["cpu"]["seconds"]) == {"user", "system", "idle", "iowait"}
    assert sample["disk"]["read_bytes"] >= 0 and sample["net"]["rx_bytes"] >= 0


def fake_smi(tmp_path: Path, body: str) -> dict:
    path = tmp_path / "bin" / "nvidia-smi"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{path.parent}:{os.environ['PATH']}"}


def test_nvidia_smi_fallback_parses_its_csv(tmp_path):
    csv = FIXTURES / "nvidia-smi-query.csv"
    # Prints the recorded lines once, or every -lms period like the real tool does.
    env = fake_smi(tmp_path, f'cat {csv}\ncase "$*" in *-lms*) while sleep 0.05; do cat {csv} || exit; done;; esac\n')
    records = run_agent("--interval", "0.1", "--count", "2", "--gpu-source", "nvidia-smi", env=env)
    assert records[0]["source"] == "nvidia-smi"
    assert "note" not in [r["type"] for r in records]
    gpus = records[-2]["gpus"]
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    assert gpus[0]["util_gpu"] == 97 and gpus[0]["mem_used_mib"] == 61234 and gpus[0]["power_w"] == 385.12
    assert gpus[1]["throttle"] == 1
    assert gpus[2]["power_w"] is None and gpus[2]["power_limit_w"] == 350.0
    assert gpus[3]["util_gpu"] is None and gpus[3]["throttle"] is None and gpus[3]["temp_c"] is None


def test_nvidia_smi_without_a_driver_is_the_one_note(tmp_path):
    env = fake_smi(tmp_path, f"cat {FIXTURES / 'nvidia-smi-no-driver.txt'}\nexit 9\n")
    records = run_agent("--interval", "0.05", "--count", "1", "--gpu-source", "nvidia-smi", env=env)
    notes = [r for r in records if r["type"] == "note"]
    assert len(notes) == 1
    assert "no NVIDIA driver found" in notes[0]["message"]
    assert "couldn't communicate with the NVIDIA driver" in notes[0]["message"]


def test_smi_line_rejects_what_is_not_a_gpu_line():
    assert sampler.parse_smi_line("No devices were found") is None
    assert sampler.parse_smi_line(", ".join(["x"] * len(sampler.SMI_KEYS))) is None


def test_nvml_values_become_the_agent_units():
    source = sampler.NvmlSource(FakeNvml(json.loads((FIXTURES / "nvml-h100-a100.json").read_text())))
    first = source.sample()
    assert first[0]["sm_active"] is None  # GPM needs two samples to measure between
    h100, a100 = source.sample()
    assert h100["name"] == "NVIDIA H100 80GB HBM3" and h100["pci_bus_id"] == "00000000:18:00.0"
    assert h100["util_gpu"] == 93 and h100["util_mem"] == 41
    assert h100["mem_used_mib"] == 65119715328 // 2**20 and h100["mem_total_mib"] == 81559
    assert h100["power_w"] == 612.345 and h100["power_limit_w"] == 700.0
    assert h100["sm_clock_mhz"] == 1980 and h100["throttle"] == 4
    assert (h100["pcie_tx_kbs"], h100["pcie_rx_kbs"]) == (18432, 402113)
    assert h100["sm_active"] == 0.715 and h100["sm_occupancy"] == 0.3325
    assert h100["processes"] == [{"pid": 1, "user": "root", "name": Path("/proc/1/comm").read_text().strip(), "used_mib": 62000}]
    # Not supported on this GPU: None, never an exception.
    assert a100["power_w"] is None and a100["power_limit_w"] == 250.0
    assert a100["pcie_tx_kbs"] is None and a100["sm_active"] is None
    assert a100["processes"][0]["used_mib"] is None
    source.close()


def test_line_buffer_keeps_a_line_split_across_chunks():
    buf = LineBuffer()
    assert buf.feed('{"a":') == []
    assert buf.feed('1}\n{"b"') == ['{"a":1}']
    assert buf.feed(":2}\n") == ['{"b":2}']


def local_connection(name="local"):
    return LocalConnection(name)


def test_watch_streams_the_agent_through_a_connection():
    run = Run()
    seen = []
    run.listeners.append(lambda host, record, sample: seen.append(record["type"]))
    summary = watch(local_connection("here"), run, 0.05, 0.25)
    assert summary["source"] == "none" and summary["samples"] == len(run.series("here")) >= 3
    assert seen[0] == "hello" and seen[-1] == "end"
    assert run.state("here").notes == [summary["notes"][0]]


def test_a_long_run_is_cut_into_agent_runs_and_still_says_its_note_once():
    run = Run()
    hellos = []
    run.listeners.append(lambda host, record, sample: record["type"] == "hello" and hellos.append(record["pid"]))
    summary = watch(local_connection("long"), run, 0.05, 0.6, chunk=0.2)
    assert len(set(hellos)) == 3  # three agents, one after the other, on the same connection
    assert summary["samples"] == len(run.series("long")) >= 9
    assert len(run.state("long").notes) == 1
    times = [s.t for s in run.series("long")]
    assert times == sorted(times)


def test_an_agent_that_fails_is_one_clear_error():
    with pytest.raises(HostError, match="the sampler stopped after 0 samples.*--interval"):
        watch(local_connection(), Run(), 0.05, 1, command=agent_command(0.05, 1).replace("--interval", "--interval-typo", 1))
    with pytest.raises(HostError, match="python3 not found"):
        watch(local_connection(), Run(), 0.05, 1, command=agent_command(0.05, 1, python="python3-absent"))


def test_ctrl_c_ends_a_run_like_its_duration_and_leaves_no_agent(tmp_path):
    (tmp_path / "hosts.yaml").write_text("all:\n  hosts:\n    one:\n      ansible_connection: local\n    two:\n      ansible_connection: local\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from gpurig.cli import main; main()", "monitor", "-i", "hosts.yaml", "--interval", "0.1", "--record", "rec"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    samples = tmp_path / "rec" / "samples.jsonl"
    try:
        deadline = time.monotonic() + 30
        while not (samples.exists() and {"one", "two"} <= {json.loads(line)["host"] for line in samples.read_text().splitlines() if '"sample"' in line}):
            # an ended monitor has all its output; a running one past the deadline is killed in finally, never waited on here
            assert proc.poll() is None, proc.communicate(timeout=20)
            assert time.monotonic() < deadline, "no samples from both hosts within 30 s"
            time.sleep(0.05)  # polling for the first samples, not a synchronisation sleep
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "ok=2" in err
    assert "one" in out and "two" in out  # the summary table
    agents = [json.loads(line)["pid"] for line in samples.read_text().splitlines() if '"hello"' in line]
    assert len(agents) == 2 and not any(running(pid) for pid in agents)


def running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie left for an init that does not reap has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

"""MIG: the agent reads each MIG device (GPM where the GPU has it) and every output shows it and says what stands in for utilisation.

NVML is replayed from tests/fixtures/monitor/nvml-mig.json (an H100 in MIG mode
with GPM, an A100 in MIG mode without, an H100 with MIG only pending); its
README says where each value's shape comes from. Non-MIG output is compared
with what gpurig rendered before MIG support (tests/fixtures/monitor/non-mig).
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nvml_replay import FIXTURES, ROOT, FakeNvml, agent_records, sampler
from prometheus_client import generate_latest
from prometheus_client.core import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from gpurig.monitor.csvfile import HEADER, write_csv
from gpurig.monitor.diagnose import ENGINE, OCCUPANCY, SM, UTIL, diagnose
from gpurig.monitor.exporter import RunCollector
from gpurig.monitor.live import findings_view, live_table, summary_table
from gpurig.monitor.record import load_run
from gpurig.monitor.session import Run

MIG = json.loads((FIXTURES / "nvml-mig.json").read_text())
NON_MIG = json.loads((FIXTURES / "nvml-h100-a100.json").read_text())
BEFORE = FIXTURES / "non-mig"  # rendered by gpurig 3ffcbca, before MIG support


def run_of(*record_lists: list[dict]) -> Run:
    run = Run()
    for records in record_lists:
        for rec in records:
            rec = dict(rec)
            run.add(rec.pop("host"), rec)
    return run


def mig_run(n: int = 4) -> Run:
    return run_of(agent_records(FakeNvml(MIG), "gpu-mig", n))


# --- the agent -------------------------------------------------------------------------------


def test_a_gpu_in_mig_mode_gets_a_row_per_mig_device_and_a_note():
    nvml = FakeNvml(MIG)
    source = sampler.NvmlSource(nvml)
    assert source.notes == [
        "GPU 0: MIG mode is on, so NVML reports no whole-GPU utilisation; GPM engine and SM activity are shown for each of its 4 MIG devices instead",
        "GPU 1: MIG mode is on, so NVML reports no whole-GPU utilisation, and GPM is not available on this GPU/driver (it needs Hopper or newer): "
        "its 2 MIG devices show memory only",
    ]
    first = source.sample()
    assert [(g["index"], g.get("mig")) for g in first] == [(0, None), (0, 0), (0, 1), (0, 2), (0, 3), (1, None), (1, 0), (1, 1), (2, None)]
    parent = first[0]
    assert parent["mig_mode"] is True and parent["util_gpu"] is None and parent["util_mem"] is None  # NOT_SUPPORTED under MIG, not 0
    assert parent["temp_c"] == 47 and parent["power_w"] == 281.904 and parent["processes"] == []  # listed on its devices instead
    tiny = first[1]
    assert tiny["name"] == "NVIDIA H100 80GB HBM3 MIG 3g.40gb" and tiny["uuid"] == "MIG-8d1f0a3c-5b7e-5c2d-9e4f-1a6b3c8d0e27"
    assert (tiny["gpu_instance"], tiny["compute_instance"], tiny["parent_uuid"]) == (2, 0, parent["uuid"])
    assert (tiny["mem_used_mib"], tiny["mem_total_mib"]) == (6212, 40448) and tiny["processes"][0]["used_mib"] == 6144
    assert tiny["gpm"] is True and tiny["sm_active"] is None  # GPM measures between two samples
    second = source.sample()
    tiny, ci0, ci1, matmul = second[1:5]
    assert (tiny["gr_active"], tiny["sm_active"], tiny["sm_occupancy"], tiny["dram_active"]) == (0.979, 0.184, 0.042, 0.021)
    assert matmul["sm_active"] == 0.915 and matmul["name"].endswith("MIG 1g.10gb")
    assert ci0["gpu_instance"] == ci1["gpu_instance"] == 3 and (ci0["compute_instance"], ci1["compute_instance"]) == (0, 1)
    a100_devices = second[6:8]
    assert all(g["gpm"] is False and g["sm_active"] is None and g["mem_total_mib"] == 19968 for g in a100_devices)
    pending = second[8]  # MIG enabled but pending a reset: still a whole GPU
    assert "mig_mode" not in pending and pending["util_gpu"] == 64 and pending["sm_active"] == 0.58
    assert pending["processes"][0]["used_mib"] == 29900
    source.close()


def test_gpm_is_read_once_per_gpu_instance_and_mig_layout_once_per_agent():
    nvml = FakeNvml(MIG)
    source = sampler.NvmlSource(nvml)
    layout = nvml.calls["nvmlDeviceGetMigDeviceHandleByIndex"]
    assert layout == 7 + 7  # every index of both MIG GPUs; the empty ones answer NOT_FOUND
    for _ in range(3):
        source.sample()
    assert nvml.calls["nvmlDeviceGetMigDeviceHandleByIndex"] == layout
    assert nvml.calls["nvmlGpmMigSampleGet"] == 3 * 3  # GPU instances 2, 3 (two compute instances) and 9; none on the A100
    assert nvml.calls["nvmlGpmSampleGet"] == 3  # the whole-GPU sample of GPU 2 only
    source.close()


def test_a_host_without_mig_pays_no_mig_or_mig_gpm_call_and_its_records_are_unchanged():
    nvml = FakeNvml(NON_MIG)
    records = agent_records(nvml, "gpu-nvml")
    assert nvml.calls["nvmlDeviceGetMaxMigDeviceCount"] == 0 and nvml.calls["nvmlGpmMigSampleGet"] == 0
    assert nvml.calls["nvmlDeviceGetMigMode"] == 2  # once per GPU, when the agent starts
    for rec in records:
        for g in rec.get("gpus", ()):
            for p in g["processes"]:
                p["user"] = p["name"] = None  # the local /proc/1's, not NVML's
                p.pop("container", None)  # so is its cgroup (a test run inside a container may see one)
    assert records == [json.loads(line) for line in (BEFORE / "agent.jsonl").read_text().splitlines()]


def test_a_metric_the_instance_cannot_measure_is_none_not_its_garbage():
    data = copy.deepcopy(MIG)
    data["devices"][0]["gpm_mig"]["9"]["dram_bw_util"] = "NOT_SUPPORTED"
    source = sampler.NvmlSource(FakeNvml(data))
    source.sample()
    matmul = source.sample()[4]
    assert matmul["dram_active"] is None and matmul["sm_active"] == 0.915 and matmul["gr_active"] == 0.992
    source.close()


def run_main(monkeypatch, capsys, data, *args):
    """The agent's main() over replayed NVML: (exit status, its records, its stderr)."""
    records: list[dict] = []
    monkeypatch.setattr(sampler, "open_gpu_source", lambda interval, want: (sampler.NvmlSource(FakeNvml(data)), None))
    monkeypatch.setattr(sampler, "emit", lambda record, out=None: records.append(json.loads(json.dumps(record))))
    code = sampler.main(["--interval", "0.01", *args])
    return code, records, capsys.readouterr().err


def test_the_agent_says_what_stands_in_for_utilisation(monkeypatch, capsys):
    code, records, err = run_main(monkeypatch, capsys, MIG, "--count", "2")
    assert code == 0 and err == ""
    assert [r["type"] for r in records] == ["hello", "note", "note", "sample", "sample", "end"]
    assert "GPU 0: MIG mode is on" in records[1]["message"] and "GPM is not available" in records[2]["message"]


def test_a_gpu_that_gives_no_metric_fails_the_agent_instead_of_an_empty_row(monkeypatch, capsys):
    data = copy.deepcopy(MIG)
    lost = data["devices"][2]
    for key in ("utilization", "memory", "temperature", "power_mw", "power_limit_mw", "clocks", "throttle", "pcie_kbs", "processes", "gpm"):
        lost[key] = "GPU_IS_LOST"  # what every call answers for a GPU that fell off the bus
    code, records, err = run_main(monkeypatch, capsys, data, "--count", "2")
    assert code == 3
    assert "sample" not in [r["type"] for r in records] and "end" not in [r["type"] for r in records]
    assert err.strip() == (
        "gpu_sampler: GPU 2 (GPU-7c9e1a3b-5d7f-4b9d-8e1a-3b5d7f9c1e57) gave no metric at all through nvml: "
        "the GPU may be lost or the driver broken; 'nvidia-smi -q' on the host says more"
    )


# --- outputs -----------------------------------------------------------------------------------


def test_csv_has_a_row_per_mig_device_under_the_same_header(tmp_path):
    run = mig_run()
    write_csv(tmp_path / "run.csv", run.series("gpu-mig"))
    text = (tmp_path / "run.csv").read_text()
    assert text.splitlines()[0] == ", ".join(HEADER)
    last = list(csv.DictReader(io.StringIO(text), skipinitialspace=True))[-9:]
    assert [r["index"] for r in last] == ["0", "0:0", "0:1", "0:2", "0:3", "1", "1:0", "1:1", "2"]
    parent, tiny, a100_device = last[0], last[1], last[6]
    assert parent["utilization.gpu [%]"] == "[N/A]" and parent["temperature.gpu"] == "47"
    assert tiny["uuid"] == "MIG-8d1f0a3c-5b7e-5c2d-9e4f-1a6b3c8d0e27" and tiny["name"] == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert tiny["utilization.gpu [%]"] == "[N/A]" and tiny["sm.active [%]"] == "18.4" and tiny["sm.occupancy [%]"] == "4.2"
    assert tiny["memory.used [MiB]"] == "6212" and tiny["pci.bus_id"] == "00000000:19:00.0"
    assert a100_device["sm.active [%]"] == "[N/A]" and a100_device["memory.total [MiB]"] == "19968"


def test_prometheus_labels_mig_devices_as_dcgm_exporter_does():
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(mig_run()))
    page = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(page)}  # the page parses: mixed label sets are valid
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert [s.labels["gpu"] for s in util] == ["2"]  # no utilisation for a GPU in MIG mode or its devices: absent, not 0
    engine = {s.labels["mig_uuid"]: s for s in families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples}
    tiny = engine["MIG-8d1f0a3c-5b7e-5c2d-9e4f-1a6b3c8d0e27"]
    assert tiny.value == 0.979
    assert tiny.labels == {
        "gpu": "0", "UUID": "GPU-3b0e8c1d-7f52-4a9e-b6d1-0c2f4e6a8b13", "pci_bus_id": "00000000:19:00.0", "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "gpu-mig", "GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "2",
        "mig_uuid": "MIG-8d1f0a3c-5b7e-5c2d-9e4f-1a6b3c8d0e27",
    }  # fmt: skip
    assert len(engine) == 4  # the two compute instances of GPU instance 3 are two series
    sm = {(s.labels["gpu"], s.labels.get("GPU_I_ID")): s.value for s in families["DCGM_FI_PROF_SM_ACTIVE"].samples}
    assert sm == {("0", "2"): 0.184, ("0", "3"): 0.0, ("0", "9"): 0.915, ("2", None): 0.58}  # none for the A100's devices (no GPM)
    fb = [s for s in families["DCGM_FI_DEV_FB_USED"].samples if s.labels["gpu"] == "1"]
    assert sorted(s.value for s in fb) == [13, 11800, 12000]  # the A100 and its two MIG devices
    assert families["DCGM_FI_PROF_DRAM_ACTIVE"].samples[0].value == 0.021


def test_live_and_summary_tables_show_mig_devices_and_say_what_util_is(tmp_path):
    run = mig_run()
    con = Console(width=80, record=True, color_system=None)
    con.print(live_table(run.latest()))
    con.print(summary_table(run))
    lines = con.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    live = {line.split()[1]: line.split()[2:4] for line in lines[1:10]}
    assert live == {
        "0": ["mig", "-"], "0:0": ["98%*", "18%"], "0:1": ["0%*", "0%"], "0:2": ["0%*", "0%"], "0:3": ["99%*", "92%"],
        "1": ["mig", "-"], "1:0": ["n/a", "n/a"], "1:1": ["n/a", "n/a"], "2": ["64%", "58%"],
    }  # fmt: skip
    text = " ".join(" ".join(lines).split())  # the captions wrap at the table's width
    assert "gpu-mig GPU 0: MIG: whole-GPU utilisation not reported; util* is GPM engine activity and sm GPM SM activity, per MIG device" in text
    assert "gpu-mig GPU 1: MIG: whole-GPU utilisation not reported; GPM not available on this GPU/driver: no activity figure" in text
    assert text.count("whole-GPU utilisation not reported") == 4  # under both tables
    summary = {line.split("│")[2].strip(): line.split("│")[4:6] for line in lines if line.startswith("│")}
    assert summary["0:0"] == [" 98%* ", " 18% "] and summary["1"] == [" mig  ", " -   "] and summary["1:0"][1].strip() == "n/a"


def test_the_diagnosis_reads_gpm_for_a_mig_device_and_names_its_source():
    findings = diagnose(mig_run(6))
    assert [(f.rule, f.gpu, f.mig) for f in findings] == [("small_kernels", 0, 0)]  # nothing on the GPUs holding the devices
    f = findings[0]
    assert f.where == "gpu-mig GPU 0:0" and f.source == f"{ENGINE}, {SM}, {OCCUPANCY}"
    assert f.evidence.startswith("GPU 0:0 (MIG 3g.40gb) engine activity (NVML GPM GRAPHICS_UTIL: MIG reports no utilisation) >= 80%")
    assert "SM activity (NVML GPM SM_UTIL) averaged 18%" in f.evidence and "SM occupancy (NVML GPM SM_OCCUPANCY) averaged 4%" in f.evidence
    con = Console(width=80, record=True, color_system=None)
    con.print(findings_view(findings))
    assert "[small_kernels] gpu-mig GPU 0:0: kernels too small" in con.export_text()


def test_two_users_on_two_mig_devices_are_not_contention():
    records = agent_records(FakeNvml(MIG), "gpu-mig", 4)
    for rec in records:
        for g in rec.get("gpus", ()):
            for p, user in zip(g["processes"], ("alice", "bob") if g.get("mig") == 0 else ("bob",)):
                p["user"] = user
    assert [f.rule for f in diagnose(run_of(records))] == ["small_kernels"]


# --- non-MIG output unchanged ------------------------------------------------------------------


def test_non_mig_csv_prometheus_tables_and_diagnosis_are_what_they_were(tmp_path, monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        run = Run()
        for case in ("healthy", "contention", "throttling"):
            for rec in map(json.loads, (FIXTURES / "runs" / case / "samples.jsonl").read_text().splitlines()):
                run.add(rec.pop("host"), rec)
        for rec in agent_records(FakeNvml(NON_MIG), "gpu-nvml"):
            run.add(rec.pop("host"), rec)
        write_csv(tmp_path / "run.csv", [s for h in run.hosts() for s in run.series(h)])
        registry = CollectorRegistry(auto_describe=False)
        registry.register(RunCollector(run))
        con = Console(width=80, record=True, color_system=None)
        con.print(live_table(run.latest()))
        con.print(summary_table(run))
        con.print(findings_view(diagnose(run)))
        assert (tmp_path / "run.csv").read_text() == (BEFORE / "run.csv").read_text()
        assert generate_latest(registry).decode() == (BEFORE / "metrics.txt").read_text()
        assert con.export_text() == (BEFORE / "tables.txt").read_text()
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_cli_replays_a_recorded_mig_run_with_its_notes(tmp_path):
    rec = tmp_path / "rec"
    rec.mkdir()
    (rec / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in agent_records(FakeNvml(MIG), "gpu-mig", 5)))
    proc = subprocess.run(
        [sys.executable, "-c", "from gpurig.cli import main; main()", "monitor", "--replay", str(rec), "--csv", "r.csv", "--json", "r.json"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "note gpu-mig: GPU 0: MIG mode is on, so NVML reports no whole-GPU utilisation" in " ".join(proc.stderr.split())
    assert "[small_kernels] gpu-mig GPU 0:0" in proc.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["findings"][0]["mig"] == 0 and "GRAPHICS_UTIL" in report["findings"][0]["source"]
    assert len(Path(tmp_path / "r.csv").read_text().splitlines()) == 1 + 5 * 9


@pytest.mark.parametrize("bad", [{"mig_mode": "yes"}, {"mig": -1}, {"gpm": 1}])
def test_a_mig_field_that_is_not_what_the_agent_writes_is_a_malformed_sample(bad):
    records = agent_records(FakeNvml(MIG), "gpu-mig", 1)
    records[-1]["gpus"][1].update(bad)
    run = run_of(records)
    assert run.series("gpu-mig") == [] and run.state("gpu-mig").malformed == 1


def test_a_recorded_mig_run_reads_back(tmp_path):
    rec = tmp_path / "rec"
    rec.mkdir()
    records = agent_records(FakeNvml(MIG), "gpu-mig", 3)
    (rec / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    back = load_run(rec)
    assert back.series("gpu-mig") == run_of(records).series("gpu-mig")
    assert [g.label for g in back.series("gpu-mig")[-1].gpus] == ["0", "0:0", "0:1", "0:2", "0:3", "1", "1:0", "1:1", "2"]


def test_the_whole_gpu_small_kernel_finding_names_its_sources_too():
    (f,) = diagnose(load_run(FIXTURES / "runs" / "small_kernels"))
    assert f.source == f"{UTIL}, {SM}, {OCCUPANCY}" and f.mig is None and f.where == "gpu-small-kernels GPU 0"
    assert f.evidence.startswith("GPU 0 utilisation (NVML utilization.gpu) >= 80% in 100% of samples, yet SM activity (NVML GPM SM_UTIL) averaged")


def test_the_plot_draws_each_mig_device_as_its_own_line(tmp_path, monkeypatch):
    from gpurig.monitor import plot as plotting

    drawn: list[tuple[str, str]] = []  # (panel, line)
    real = plotting.plt.Axes.plot
    monkeypatch.setattr(plotting.plt.Axes, "plot", lambda ax, *a, **kw: (drawn.append((ax.get_title(), kw.get("label"))), real(ax, *a, **kw))[1])
    assert plotting.plot(mig_run(), tmp_path / "mig.png") == [f"gpu-mig: {p}" for p in plotting.PANELS]
    assert (tmp_path / "mig.png").read_bytes()[:4] == b"\x89PNG"
    util = [line for panel, line in drawn if panel.endswith(plotting.PANELS[0])]
    assert util == ["GPU 0:0 (GPM engine)", "GPU 0:1 (GPM engine)", "GPU 0:2 (GPM engine)", "GPU 0:3 (GPM engine)", "GPU 2"]  # none at 0 for MIG GPUs
    memory = [line for panel, line in drawn if panel.endswith(plotting.PANELS[2])]
    assert memory == ["GPU 0", "GPU 0:0", "GPU 0:1", "GPU 0:2", "GPU 0:3", "GPU 1", "GPU 1:0", "GPU 1:1", "GPU 2"]

"""Slurm job labels, gpurig's side: the agent's hpc_jobs/hpc_users become typed samples, dcgm-exporter's hpc_job label, and a job column where it fits.

Records come from the agent over replayed NVML (tests/unit/nvml_replay.py) with
the hand-made mapping folders of tests/fixtures/monitor/slurm and slurm-mig,
and from the recorded run runs/slurm_jobs.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from nvml_replay import FIXTURES, ROOT, FakeNvml, agent_records, sampler
from prometheus_client import generate_latest
from prometheus_client.core import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from gpurig.monitor import samples
from gpurig.monitor.csvfile import HEADER, write_csv
from gpurig.monitor.exporter import HPC_JOB_LABEL, HPC_USER_LABEL, RunCollector
from gpurig.monitor.live import live_table, summary_table
from gpurig.monitor.record import load_run
from gpurig.monitor.samples import HpcJob
from gpurig.monitor.session import Run

NON_MIG = json.loads((FIXTURES / "nvml-h100-a100.json").read_text())
MIG = json.loads((FIXTURES / "nvml-mig.json").read_text())
SLURM_RUN = FIXTURES / "runs" / "slurm_jobs"


def slurm_records(data: dict, host: str, mapping: Path, n: int = 3) -> list[dict]:
    """The agent's records over replayed NVML with the node's job mapping read into each sample, as its main loop does."""
    records = agent_records(FakeNvml(data), host, n)
    for rec in records:
        if rec["type"] == "sample":
            sampler.add_slurm_jobs(rec["gpus"], str(mapping / "slurm-gpus"), str(mapping / "slurm-jobs"))
    return records


def run_of(*record_lists: list[dict]) -> Run:
    run = Run()
    for records in record_lists:
        for rec in records:
            rec = dict(rec)
            run.add(rec.pop("host"), rec)
    return run


def page(run: Run) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(run))
    return generate_latest(registry).decode()


# --- samples --------------------------------------------------------------------------------------


def test_the_records_become_typed_jobs():
    run = run_of(slurm_records(NON_MIG, "gpu-slurm", FIXTURES / "slurm"))
    h100, a100 = run.latest()["gpu-slurm"].gpus
    assert h100.hpc_jobs == (HpcJob("42", "alice"),)
    assert a100.hpc_jobs == (HpcJob("43", "bob"), HpcJob("44", None))
    assert run_of(agent_records(FakeNvml(NON_MIG), "plain")).latest()["plain"].gpus[0].hpc_jobs == ()


def test_the_client_checks_what_the_agent_checks():
    assert samples.JOB_ID.pattern == sampler.JOB_ID.pattern.decode()
    assert samples.USER_NAME.pattern == sampler.USER_NAME.pattern.decode()
    assert samples.MAX_JOBS == sampler.MAX_JOBS


@pytest.mark.parametrize(
    "bad",
    [
        {"hpc_jobs": "42", "hpc_users": ["alice"]},
        {"hpc_jobs": ["42"]},  # users missing
        {"hpc_users": ["alice"]},
        {"hpc_jobs": ["42", "43"], "hpc_users": ["alice"]},
        {"hpc_jobs": [], "hpc_users": []},
        {"hpc_jobs": [str(n) for n in range(17)], "hpc_users": [None] * 17},
        {"hpc_jobs": ["42", "42"], "hpc_users": ["alice", "alice"]},  # two identical series would make Prometheus refuse the page
        {"hpc_jobs": [42], "hpc_users": ["alice"]},
        {"hpc_jobs": ['42"} 1\nfake_metric{a="'], "hpc_users": [None]},
        {"hpc_jobs": ["\u0664\u0662"], "hpc_users": [None]},  # Arabic-Indic digits are not Slurm's
        {"hpc_jobs": ["42"], "hpc_users": ["-rf"]},
        {"hpc_jobs": ["42"], "hpc_users": ["a" * 65]},
        {"hpc_jobs": ["42"], "hpc_users": [1001]},
    ],
)
def test_job_fields_that_are_not_what_the_agent_writes_are_a_malformed_sample(bad):
    records = agent_records(FakeNvml(NON_MIG), "gpu-slurm", 1)
    records[-1]["gpus"][0].update(bad)
    run = run_of(records)
    assert run.series("gpu-slurm") == [] and run.state("gpu-slurm").malformed == 1


# --- the exporter ---------------------------------------------------------------------------------


def test_the_exporter_labels_each_gpu_with_the_job_holding_it_and_only_that_gpu():
    run = run_of(slurm_records(NON_MIG, "gpu-slurm", FIXTURES / "slurm"), agent_records(FakeNvml(NON_MIG), "gpu-plain"))
    text = page(run)
    lines = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    assert [line for line in lines if 'hpc_job="42"' in line] == [line for line in lines if 'Hostname="gpu-slurm"' in line and 'gpu="0"' in line]
    families = {f.name: f for f in text_string_to_metric_families(text)}
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    held = {(s.labels["Hostname"], s.labels["gpu"], s.labels.get(HPC_JOB_LABEL), s.labels.get(HPC_USER_LABEL)): s.value for s in util}
    assert held == {
        ("gpu-slurm", "0", "42", "alice"): 93.0,
        ("gpu-slurm", "1", "43", "bob"): 0.0,  # a shared GPU: its value once per job, as dcgm-exporter does
        ("gpu-slurm", "1", "44", None): 0.0,  # the job's user unknown: no hpc_user label, not an empty one
        ("gpu-plain", "0", None, None): 93.0,
        ("gpu-plain", "1", None, None): 0.0,
    }
    plain = next(s for s in util if s.labels["Hostname"] == "gpu-plain")
    assert set(plain.labels) == {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}  # no job, no label at all
    for family in families.values():  # every GPU metric carries the job, and no series is there twice
        series = Counter((s.name, tuple(sorted(s.labels.items()))) for s in family.samples)
        assert max(series.values(), default=1) == 1, family.name
        if family.name.startswith("DCGM_FI_"):
            on_gpu0 = [s for s in family.samples if s.labels["Hostname"] == "gpu-slurm" and s.labels["gpu"] == "0"]
            assert all(s.labels.get(HPC_JOB_LABEL) == "42" and s.labels[HPC_USER_LABEL] == "alice" for s in on_gpu0), family.name


def test_a_mig_device_carries_the_job_of_its_gpu_instance():
    run = run_of(slurm_records(MIG, "gpu-mig", FIXTURES / "slurm-mig", 2))
    families = {f.name: f for f in text_string_to_metric_families(page(run))}
    engine = {s.labels["mig_uuid"]: s.labels for s in families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples}
    jobs = {(labels["GPU_I_ID"], labels.get(HPC_JOB_LABEL), labels.get(HPC_USER_LABEL)) for labels in engine.values()}
    assert jobs == {("2", None, None), ("3", "46", "erin"), ("9", "45_3", "dave")}
    assert len(engine) == 4  # GPU instance 3's two compute instances: two series, both job 46's


def test_a_run_without_jobs_renders_the_page_it_always_did():
    assert HPC_JOB_LABEL not in page(load_run(FIXTURES / "runs" / "healthy"))


# --- tables and CSV -------------------------------------------------------------------------------


def rendered(table, width: int = 80) -> list[str]:
    con = Console(width=width, record=True, color_system=None)
    con.print(table)
    return con.export_text().splitlines()


def test_the_live_view_has_a_job_column_where_it_fits_80_columns():
    lines = rendered(live_table(load_run(SLURM_RUN).latest()))
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    assert lines[0].split()[-1] == "job"
    rows = {line.split()[1]: line.split()[10:] for line in lines[1:]}
    assert rows == {"0": ["42", "alice"], "1": ["43", "bob", "+1"], "2": []}


def test_a_job_column_that_does_not_fit_is_left_out_and_said():
    run = load_run(SLURM_RUN)
    wide = {"a-long-host-14": run.latest()["gpu-slurm-jobs"]}
    records = [json.loads(line) for line in (SLURM_RUN / "samples.jsonl").read_text().splitlines()]
    records[-1]["gpus"][0]["hpc_jobs"], records[-1]["gpus"][0]["hpc_users"] = ["123456789_1234"], ["a-rather-long-user-name"]
    latest = run_of([{**r, "host": "a-long-host-14"} for r in records]).latest()
    for table in (live_table(latest), live_table(wide, width=60)):
        lines = rendered(table)
        assert all(len(line) <= 80 for line in lines) and "job" not in lines[0].split()
        assert "not shown at" in " ".join(lines) and "hpc_job" in " ".join(lines)
    assert "a-rather-long-user-name" in " ".join(rendered(live_table(latest, width=120), 120))


def test_the_summary_names_every_job_seen_and_leaves_out_the_gpu_source_for_it():
    run = load_run(SLURM_RUN)
    for width, source in ((80, False), (120, True)):
        lines = rendered(summary_table(run, width=width), width)
        assert all(len(line) <= width for line in lines), "\n".join(lines)
        header = [cell.strip() for cell in lines[1].split("┃")[1:-1]]
        assert header[-1] == "job" and ("source" in header) is source
        rows = {line.split("│")[2].strip(): line.split("│")[-2].strip() for line in lines if line.startswith("│")}
        assert rows == {"0": "42 alice", "1": "43 bob +1", "2": ""}
        assert ("not shown at 80 columns: source" in lines[-1]) is not source


def test_the_csv_keeps_nvidia_smis_columns(tmp_path):
    run = load_run(SLURM_RUN)
    write_csv(tmp_path / "run.csv", run.series("gpu-slurm-jobs"))
    text = (tmp_path / "run.csv").read_text()
    assert text.splitlines()[0] == ", ".join(HEADER)
    assert len(list(csv.DictReader(io.StringIO(text), skipinitialspace=True))) == 3 * 30
    assert not any("job" in name or "hpc" in name for name in HEADER)  # the jobs are in the exporter and the records, not the CSV


def test_cli_replay_shows_the_jobs_at_the_terminals_width(tmp_path):
    for columns, seen in (("80", "not shown at 80 columns: source"), ("120", "nvml")):
        proc = subprocess.run(
            [sys.executable, "-c", "from gpurig.cli import main; main()", "monitor", "--replay", str(SLURM_RUN)],
            capture_output=True, text=True, cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": columns},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "42 alice" in proc.stdout and "43 bob +1" in proc.stdout and seen in proc.stdout
        table = proc.stdout.split("diagnosis:")[0]  # the findings' lines are not a table's
        assert all(len(line) <= int(columns) for line in table.splitlines())

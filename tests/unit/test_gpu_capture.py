"""bench/gpu_capture.py: its run on this machine, and every recorded GPU capture in tests/fixtures/gpu/ replayed through gpurig's parsers.

A capture folder holds what a real GPU host printed (nvidia-smi -q -x, the
host and torch probes' documents, the sampler under two loads). Each one
present is replayed: the host probe re-reads the XML, gpurig parses the probe
documents and the sampler's records, and figures.md is recomputed from the
files. Where no folder is recorded yet, the capture is run here instead and
must have said what it skipped: a replay that found nothing cannot pass quietly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpurig.connect.connection import Result
from gpurig.monitor.samples import sample_from_record
from gpurig.verify.runner import parse_document

pytestmark = pytest.mark.timeout(1500)  # on a GPU machine the capture itself runs for real (a few minutes, bounded at 1200 s)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_capture.py"
RECORDED = ROOT / "tests" / "fixtures" / "gpu"
MACHINES = sorted(p for p in RECORDED.iterdir() if p.is_dir()) if RECORDED.is_dir() else []
FULL_IDS = {"cuda.available", "cuda.devices", "cuda.arch", "cuda.kernel_correct", "matmul.bf16", "matmul.tf32", "membw", "pcie.h2d",
            "pcie.d2h", "nccl.allreduce", "training"}  # fmt: skip


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_capture", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def capture_here(tmp_path_factory):
    """The script run on this machine, as a user would: (exit status, stdout, the folder it wrote)."""
    out = tmp_path_factory.mktemp("capture")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=1200)
    return proc.returncode, proc.stdout + proc.stderr, out


def _cuda_here() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.version.cuda) and torch.cuda.is_available()


def assert_skipped_report(code: int, said: str, out: Path) -> None:
    """What a GPU-less run must say: exit 0, every step listed as skipped with its reason, nothing but the manifest written."""
    assert code == 0, said
    manifest = json.loads((out / "manifest.json").read_text())
    titles = [s["step"] for s in manifest["steps"]]
    assert len(titles) == 5 and titles[0] == "nvidia-smi -q -x" and "--level full" in titles[2]
    assert [s["status"] for s in manifest["steps"]] == ["skipped"] * 5
    for step in manifest["steps"]:
        assert step["why"] and f"skipped  {step['step']}: {step['why']}" in said
    assert "skipped 5 of 5" in said
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]  # no half-captured fixture to copy by mistake


@pytest.mark.skipif(_cuda_here(), reason="this machine has a GPU: the capture runs for real (test_recorded_capture_replays)")
def test_on_a_machine_without_a_gpu_every_step_says_why_it_was_skipped(capture_here):
    code, said, out = capture_here
    assert_skipped_report(code, said, out)
    assert "nvidia-smi is not on PATH" in said or "no NVIDIA driver loaded" in said


def test_output_folder_is_required_and_an_earlier_capture_is_never_overwritten(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    bare = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, env=env)
    assert bare.returncode == 2 and "give --out DIR (or set $OUT)" in bare.stderr
    (tmp_path / "manifest.json").write_text("{}")
    again = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already holds a capture" in again.stderr
    assert (tmp_path / "manifest.json").read_text() == "{}"


def test_figures_from_hand_made_probe_records():
    """The figures table's arithmetic on records written by hand here (not a capture): fraction of the peak the record carries."""
    gc = _load_script()
    doc = {"records": [
        {"id": "matmul.bf16", "status": "pass", "measured": 791.2, "expected": 989.0, "unit": "TFLOP/s"},
        {"id": "membw", "status": "fail", "measured": 2400.0, "expected": 4800.0, "unit": "GB/s"},
        {"id": "pcie.h2d", "status": "pass", "measured": 51.3, "expected": None, "unit": "GB/s"},
        {"id": "cuda.arch", "status": "pass", "measured": "sm_90"},
    ]}  # fmt: skip
    assert gc.throughput_rows(doc) == [
        "| matmul.bf16 | 791.2 | TFLOP/s | 989.0 | 80% | pass |",
        "| membw | 2400 | GB/s | 4800.0 | 50% | fail |",
        "| pcie.h2d | 51.3 | GB/s | - | - | pass |",
    ]
    hand_made = [json.dumps({"type": "hello", "source": "nvml"})] + [
        json.dumps({"type": "sample", "gpus": [{"util_gpu": u, "sm_active": s, "sm_occupancy": 0.5, "sm_clock_mhz": 1980, "power_w": 650.0}]})
        for u, s in ((0, None), (100, 0.9), (98, 0.8))
    ]  # the first sample (GPM has no interval yet) is left out of the means
    assert gc.load_row("matmul", hand_made) == "| matmul (8192x8192 bf16 matmuls back to back) | 2 | 99 % | 85 % | 50 % | 1980 | 650 |"


def test_machine_names_make_fixture_folders():
    gc = _load_script()
    assert gc.machine_name("NVIDIA H200", "570.133.20") == "nvidia-h200-driver570"
    assert gc.machine_name(None, None) == "no-gpu"


@pytest.mark.parametrize("machine", MACHINES or [None], ids=[p.name for p in MACHINES] or ["nothing-recorded"])
def test_recorded_capture_replays(machine, capture_here):
    if machine is None:
        code, said, out = capture_here
        if not _cuda_here():
            assert_skipped_report(code, said, out)  # nothing recorded, nothing capturable: the skip report is what is checked
            return
        assert code == 0, said
        machine = out  # a GPU here and nothing recorded: replay the fresh capture
    replay(machine)


def replay(folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    ok = {s["step"].split(" (")[0]: s for s in manifest["steps"] if s["status"] == "ok"}
    assert {"nvidia-smi -q -x", "host probe", "torch probe --level full"} <= set(ok), f"{folder.name} is not a GPU capture: {manifest['steps']}"
    for step in ok.values():
        assert all((folder / name).is_file() for name in step["files"]), step

    # the host probe reads the recorded XML as it reads nvidia-smi on a host, and agrees with its live NVML run
    replayed = subprocess.run(
        [sys.executable, str(ROOT / "checks" / "verify_host.py"), "--json", "--source", "smi", "--smi-xml", str(folder / "nvidia-smi-q.xml"),
         "--proc-version", str(folder / "proc-driver-nvidia-version.txt")], capture_output=True, text=True, timeout=60)  # fmt: skip
    again = parse_document(Result(folder.name, "verify_host.py", replayed.returncode, replayed.stdout, replayed.stderr), "host")
    live = parse_document(Result(folder.name, "verify_host.py", 0, (folder / "verify-host.json").read_text(), ""), "host")
    assert again and live, replayed.stderr
    by_id = {r.id: r for r in again}
    assert by_id["host.driver"].status == "pass" and manifest["driver"] in str(by_id["host.driver"].measured)
    assert {r.id for r in again} == {r.id for r in live}
    assert by_id["host.gpu_count"].measured == {r.id: r for r in live}["host.gpu_count"].measured

    torch = parse_document(Result(folder.name, "verify_torch.py", 0, (folder / "verify-torch-full.json").read_text(), ""), "container")
    assert torch and {r.id for r in torch} >= FULL_IDS
    assert not any("probe gave status" in r.detail for r in torch)
    figures = {r.id: r for r in torch}
    assert figures["matmul.bf16"].unit == "TFLOP/s" and figures["membw"].unit == "GB/s"

    for kind in ("matmul", "tiny"):
        path = folder / f"sampler-{kind}.jsonl"
        if not path.is_file():
            continue
        records = [json.loads(line) for line in path.read_text().splitlines()]
        samples = [sample_from_record(folder.name, r) for r in records if r["type"] == "sample"]
        assert records[0]["type"] == "hello" and records[-1]["type"] == "end" and len(samples) >= 3
        assert all(g.util_gpu is not None and 0 <= g.util_gpu <= 100 for s in samples for g in s.gpus)

    assert (folder / "figures.md").read_text() == _load_script().figures_markdown(folder)

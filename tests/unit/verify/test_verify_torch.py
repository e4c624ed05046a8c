"""checks/verify_torch.py: its decisions from observed facts (the fault catalogue), and one real run on this CPU machine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cputime import ChildCPU

SCRIPT = Path(__file__).resolve().parents[3] / "checks" / "verify_torch.py"
KEYS = {"id", "status", "measured", "expected", "unit", "detail", "fix"}


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("verify_torch", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_probe_imports_nothing_of_gpurig():
    text = SCRIPT.read_text()
    assert "import gpurig" not in text and "from gpurig" not in text


# ---- the fault catalogue, from the facts a container would show ----


def test_cpu_only_torch_says_rebuild_with_cuda(probe):
    detail, fix = probe.why_no_cuda(None, ["/dev/nvidia0"], "580.65.06", None)
    assert "CPU-only torch in the image" in detail
    assert "rebuild the image with a CUDA entry" in fix


def test_container_without_gpus_names_the_gpus_flag(probe):
    detail, fix = probe.why_no_cuda("13.0", [], "580.65.06", "RuntimeError: Found no NVIDIA driver on your system")
    assert detail.startswith("container started without GPUs")
    assert "--gpus" in fix and "gpurig_containers" in fix


def test_cuda_torch_on_a_host_without_driver(probe):
    detail, fix = probe.why_no_cuda("13.0", [], None, "RuntimeError: Found no NVIDIA driver on your system")
    assert "no NVIDIA driver on the host" in detail
    assert "gpurig provision" in fix


def test_image_cuda_newer_than_the_driver_names_both_versions(probe):
    error = ("RuntimeError: The NVIDIA driver on your system is too old (found version 12080). "
             "Please update your GPU driver by downloading and installing a new version")
    detail, fix = probe.why_no_cuda("13.0", ["/dev/nvidia0"], "570.133.20", error)
    assert detail == "host driver too old for CUDA 13.0: driver 570.133.20 < 580.65.06"
    assert "upgrade the host driver to >= 580.65.06" in fix
    assert "CUDA 12.8" in fix  # the newest CUDA this driver runs


def test_driver_too_old_from_cuda_runtime_words_without_proc_version(probe):
    error = "CUDA driver version is insufficient for CUDA runtime version"
    detail, fix = probe.why_no_cuda("12.8", ["/dev/nvidia0"], None, error)
    assert detail.startswith("host driver too old for CUDA 12.8")
    assert ">= 570.26" in fix


def test_module_library_mismatch_is_named(probe):
    detail, fix = probe.why_no_cuda("12.8", ["/dev/nvidia0"], "570.124.06", "Failed to initialize NVML: Driver/library version mismatch")
    assert "kernel module and user-space driver library differ" in detail
    assert "reboot" in fix


@pytest.mark.parametrize("cuda,driver,floor", [("12.8", "570.26", None), ("12.6", "550.54.14", "560.28.03"), ("12.10", "575.0", "575.51.03")])
def test_driver_table_rows(probe, cuda, driver, floor):
    result = probe.driver_too_old(cuda, driver)
    assert (result is None) == (floor is None)
    if floor:
        assert floor in result[0]


def test_driver_table_matches_gpurigs(probe):
    from gpurig.image.compat import CUDA_RELEASES

    assert dict(probe.MIN_DRIVER) == {r.cuda: r.min_driver for r in CUDA_RELEASES}


def test_cuda_label_mismatch_fails(probe):
    r = probe.cuda_version_record("12.8", "13.0")
    assert r["status"] == "fail" and "labelled CUDA 13.0" in r["detail"] and "12.8" in r["detail"]
    assert probe.cuda_version_record(None, "cpu")["status"] == "pass"


def test_arch_present_older_same_major_ptx_and_missing(probe):
    archs = ["sm_80", "sm_90", "sm_100", "compute_120"]
    assert probe.arch_record((9, 0), archs, "NVIDIA H200")["status"] == "pass"
    assert probe.arch_record((8, 6), archs)["status"] == "pass"  # sm_80 cubins run on 8.6
    assert probe.arch_record((12, 1), archs)["status"] == "warn"  # only PTX to JIT
    missing = probe.arch_record((7, 0), archs, "Tesla V100")
    assert missing["status"] == "fail" and "sm_70" in missing["fix"] and "sm_80, sm_90" in missing["detail"]


def test_shm_default_64mb_fails_with_the_dataloader_explanation(probe):
    r = probe.shm_record(64 << 20)
    assert r["status"] == "fail" and r["measured"] == 64
    assert "DataLoader workers" in r["detail"] and "bus error" in r["detail"]
    assert "shm_size: 16g" in r["fix"] and "--shm-size" in r["fix"]
    assert probe.shm_record(512 << 20)["status"] == "warn"
    assert probe.shm_record(16 << 30)["status"] == "pass"


def test_throughput_passes_at_70_percent_and_always_says_the_fraction(probe):
    peak = probe.peak_for("NVIDIA H200")
    assert peak["bf16"] == 989.0 and peak["membw"] == 4800.0
    good = probe.throughput_record("matmul.bf16", 780.0, peak["bf16"], "TFLOP/s", "8192^3 bf16")
    slow = probe.throughput_record("matmul.bf16", 400.0, peak["bf16"], "TFLOP/s", "8192^3 bf16")
    assert good["status"] == "pass" and good["detail"].startswith("79% of the 989 TFLOP/s peak")
    assert slow["status"] == "fail" and slow["detail"].startswith("40% of") and slow["fix"]
    assert good["expected"] == 989.0


def test_peak_rows_prefer_the_specific_name(probe):
    assert probe.peak_for("NVIDIA H100 PCIe")["bf16"] == 756.0
    assert probe.peak_for("NVIDIA H100 80GB HBM3")["bf16"] == 989.0
    assert probe.peak_for("NVIDIA A100-SXM4-80GB")["bf16"] == 312.0
    unknown = probe.throughput_record("matmul.bf16", 100.0, None, "TFLOP/s", "x", "Tesla T4")
    assert unknown["status"] == "warn" and "GPU_PEAKS" in unknown["fix"]


def test_wrong_kernel_result_fails(probe):
    assert probe.kernel_record(1e-6, 1e-4, "matmul")["status"] == "pass"
    bad = probe.kernel_record(0.3, 1e-4, "matmul")
    assert bad["status"] == "fail" and "wrong answers" in bad["detail"]


def test_training_explains_utilisation_vs_sm_activity(probe):
    r = probe.training_record(1234.5, 0.98, 0.41, "", "NVIDIA H200")
    assert "GPU utilisation 98%" in r["detail"] and "SM activity 41%" in r["detail"]
    assert "at least one kernel was running" in r["detail"] and "fraction of SMs" in r["detail"]
    none = probe.training_record(10.0, None, None, "NVML GPM metrics need a Hopper or newer GPU", "A100")
    assert "SM activity not available (NVML GPM metrics need a Hopper" in none["detail"]


def test_text_table_aligns_and_shows_fixes(probe):
    records = [probe.shm_record(64 << 20), probe.record("torch.import", "pass", "2.13.0")]
    lines = probe.text_table(records).splitlines()
    assert lines[0].split() == ["STATUS", "ID", "MEASURED", "EXPECTED"]
    assert lines[1].index("shm.size") == lines[0].index("ID")
    assert any(line.strip().startswith("fix: ") for line in lines)


# ---- one real run on this CPU machine ----


def run_probe(*args: str, stdin: bool = False, env: dict[str, str] | None = None, python: tuple[str, ...] = (sys.executable,)):
    env = {**{k: v for k, v in os.environ.items() if k != "GPURIG_CUDA"}, **(env or {})}
    if stdin:
        return subprocess.run([*python, "-", *args], input=SCRIPT.read_text(), capture_output=True, text=True, timeout=120, env=env)
    return subprocess.run([*python, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env)


def test_cpu_machine_gets_a_verdict_not_a_crash():
    pytest.importorskip("torch")
    with ChildCPU() as cpu:  # CPU time (the probe's and its DataLoader workers'): load on the machine cannot stretch it
        proc = run_probe("--json", "--level", "full", "--expect-cuda", "cpu", stdin=True)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["probe"] == "container" and doc["version"] == 1
    by_id = {r["id"]: r for r in doc["records"]}
    assert all(set(r) == KEYS for r in doc["records"])
    assert by_id["torch.import"]["status"] == "pass"
    assert by_id["cuda.available"]["status"] == "fail"
    assert "CPU-only torch" in by_id["cuda.available"]["detail"]
    gpu = ["cuda.arch", "cuda.kernel_correct", "matmul.bf16", "matmul.tf32", "membw", "nccl.allreduce", "training"]
    assert all(by_id[g]["status"] == "skip" and "cuda.available" in by_id[g]["detail"] for g in gpu)
    assert by_id["dataloader.workers"]["status"] == "pass"  # CPU-side records still run
    assert by_id["shm.size"]["status"] in ("pass", "warn", "fail")
    assert cpu.seconds < 10


def test_in_a_gpurig_image_the_cuda_it_was_built_for_is_compared_without_a_flag():
    pytest.importorskip("torch")
    proc = run_probe("--json", env={"GPURIG_CUDA": "13.0"})  # what the image's ENV says
    by_id = {r["id"]: r for r in json.loads(proc.stdout)["records"]}
    cuda = by_id["torch.cuda_version"]
    assert cuda["expected"] == "13.0" and cuda["status"] == ("pass" if cuda["measured"] == "13.0" else "fail")
    assert by_id["cuda.available"]["status"] == "fail" and by_id["cuda.available"]["fix"]


def test_without_torch_it_fails_with_the_fix_and_no_traceback():
    proc = run_probe("--text", python=(sys.executable, "-S"))  # -S: no site-packages, so surely no torch
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "FAIL" in proc.stdout and "torch.import" in proc.stdout and "fix: install torch" in proc.stdout


def test_help_and_text_output():
    proc = run_probe("--help")
    assert proc.returncode == 0 and "--level" in proc.stdout and "--expect-cuda" in proc.stdout
    bad = run_probe("--level", "slow")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


class FakeCudaTorch:
    """What a CUDA build of torch shows in a container where CUDA cannot start: only the calls the probe makes then."""

    def __init__(self, init_error: str) -> None:
        import types

        def init():
            raise RuntimeError(init_error)

        self.version = types.SimpleNamespace(cuda="13.0")
        self.cuda = types.SimpleNamespace(is_available=lambda: False, init=init)


def test_cuda_torch_with_old_driver_through_the_probes_own_flow(probe, monkeypatch):
    monkeypatch.setattr(probe, "device_nodes", lambda: ["/dev/nvidia0"])
    monkeypatch.setattr(probe, "host_driver", lambda: "570.133.20")
    error = "The NVIDIA driver on your system is too old (found version 12080)."
    records = probe.gpu_records(FakeCudaTorch(error), "full")
    first, *rest = records
    assert first["id"] == "cuda.available" and first["status"] == "fail"
    assert first["detail"] == "host driver too old for CUDA 13.0: driver 570.133.20 < 580.65.06"
    assert [r["id"] for r in rest] == list(probe.GPU_QUICK + probe.GPU_FULL)
    assert all(r["status"] == "skip" for r in rest)


def test_cuda_torch_on_a_host_without_driver_through_the_probes_own_flow(probe, monkeypatch):
    monkeypatch.setattr(probe, "device_nodes", lambda: [])
    monkeypatch.setattr(probe, "host_driver", lambda: None)
    [first, *_] = probe.gpu_records(FakeCudaTorch("Found no NVIDIA driver on your system."), "quick")
    assert first["status"] == "fail" and "no NVIDIA driver on the host" in first["detail"]


class CudaOnCpu:
    """torch with its CUDA side replaced by the CPU: the GPU records' own code runs end to end without a GPU.

    No numbers it measures mean anything; the test proves the flow (every
    GPU record comes out, with its unit and figures, none of them a Python
    error), which no machine here could otherwise exercise.
    """

    def __init__(self, gpus: int = 2) -> None:
        import contextlib
        import types

        import torch

        self._torch = torch
        self.version = types.SimpleNamespace(cuda="13.0")

        class Event:
            def __init__(self, enable_timing=False):
                self.t = 0.0

            def record(self):
                self.t = time.perf_counter()

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return max((end.t - self.t) * 1000.0, 1e-3)

        def all_reduce(tensors):
            total = sum(t.clone() for t in tensors)
            for t in tensors:
                t.copy_(total)

        props = types.SimpleNamespace(uuid="2b6ecd7e-4f6b-1d5a-9f0c-0c1f5c1e3a11")
        self.cuda = types.SimpleNamespace(
            is_available=lambda: True, device_count=lambda: gpus, get_device_name=lambda d=None: "NVIDIA H200",
            get_device_capability=lambda d=None: (9, 0), get_arch_list=lambda: ["sm_80", "sm_90"],
            get_device_properties=lambda d: props, Event=Event, synchronize=lambda d=None: None,
            device=lambda d: contextlib.nullcontext(), nccl=types.SimpleNamespace(all_reduce=all_reduce),
        )

    def device(self, kind, index=None):
        return self._torch.device("cpu")

    def __getattr__(self, name):
        return getattr(self._torch, name)


@pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")  # autocast("cuda") on the CPU stand-in
def test_full_level_gpu_flow_runs_end_to_end(probe, monkeypatch):
    pytest.importorskip("torch")
    import functools

    small = {"measure_matmul": {"n": 64, "reps": 2}, "measure_membw": {"nbytes": 1 << 20, "reps": 2},
             "measure_pcie": {"nbytes": 1 << 20, "reps": 2}, "measure_allreduce": {"numel": 1024, "reps": 2},
             "measure_training": {"seconds": 0.3, "batch": 2, "seq": 8, "width": 32, "layers": 1}}
    for name, sizes in small.items():
        monkeypatch.setattr(probe, name, functools.partial(getattr(probe, name), **sizes))
    fake = CudaOnCpu(gpus=2)
    records = {r["id"]: r for r in probe.gpu_records(fake, "full")}
    assert list(records) == ["cuda.available", *probe.GPU_QUICK, *probe.GPU_FULL]
    assert records["cuda.devices"]["measured"] == ["GPU-2b6ecd7e-4f6b-1d5a-9f0c-0c1f5c1e3a11"] * 2
    assert records["cuda.arch"]["status"] == "pass" and records["cuda.kernel_correct"]["status"] == "pass"
    for rid, unit in (("matmul.bf16", "TFLOP/s"), ("matmul.tf32", "TFLOP/s"), ("membw", "GB/s")):
        r = records[rid]
        assert r["unit"] == unit and r["expected"] == probe.peak_for("NVIDIA H200")[rid.split(".")[-1]] and "% of the" in r["detail"]
    assert records["nccl.allreduce"]["status"] == "pass" and "correct sum" in records["nccl.allreduce"]["detail"]
    assert records["training"]["status"] == "pass" and records["training"]["unit"] == "samples/s"
    assert "SM activity not available" in records["training"]["detail"]
    assert all("Error" not in r["detail"] for rid, r in records.items() if not rid.startswith("pcie"))


def test_json_document_validates_against_the_probe_schema():
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("torch")
    schema = json.loads((SCRIPT.parent / "verify-probe.schema.json").read_text())
    proc = run_probe("--json")
    jsonschema.validate(json.loads(proc.stdout), schema)


def test_utilisation_falls_back_to_nvidia_smi_when_no_nvml_binding(probe, tmp_path, monkeypatch):
    """A GPU container with the toolkit's nvidia-smi but no nvidia-ml-py: utilisation still measured, SM activity said missing."""
    smi = tmp_path / "nvidia-smi"
    # what `nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -i UUID` prints for one GPU
    smi.write_text("#!/bin/sh\necho 97\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml fails, as in an image without it
    sampler = probe.Utilisation(0, "GPU-2b6ecd7e-4f6b-1d5a-9f0c-0c1f5c1e3a11")
    with sampler:
        deadline = time.monotonic() + 10
        while not sampler.util and time.monotonic() < deadline:
            time.sleep(0.1)  # polling until the sampler's first reading, with a deadline
    util, sm, why = sampler.means()
    assert util == 0.97 and sm is None and "pip install nvidia-ml-py" in why


@pytest.mark.parametrize("name, label", [
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"), ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA L40S", "L40S"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    # variants with other figures get no verdict, not another GPU's peak
    ("NVIDIA A100-SXM4-40GB", None), ("NVIDIA A100 80GB PCIe", None), ("NVIDIA H100 NVL", None),
    ("NVIDIA GH200 480GB", None), ("NVIDIA H200 NVL", None),
])
def test_peaks_are_looked_up_by_the_exact_variant(probe, name, label):
    assert (probe.peak_for(name) or {}).get("label") == label

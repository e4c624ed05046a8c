"""checks/gpu_health.py on a machine without a GPU: JSON records with reasons, never a traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[2] / "checks" / "gpu_health.py"
FIELDS = {"id", "status", "measured", "expected", "detail", "fix"}


def run_probe(*args, env=None, python=sys.executable):
    proc = subprocess.run(
        [python, str(PROBE), *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )
    assert "Traceback" not in proc.stderr
    return proc


def records(proc):
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    for record in out:
        assert set(record) == FIELDS
        assert record["status"] in ("pass", "warn", "fail", "skip")
    return {r["id"]: r for r in out}


def test_probe_does_not_import_gpurig():
    source = PROBE.read_text()
    assert "import gpurig" not in source and "from gpurig" not in source


def test_without_torch_it_fails_with_the_fix(tmp_path):
    # a bare interpreter: -S skips site-packages, so torch is surely absent
    proc = subprocess.run([sys.executable, "-S", str(PROBE)], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr
    found = records(proc)
    assert proc.returncode == 1
    assert found["torch.import"]["status"] == "fail"
    assert "install torch" in found["torch.import"]["fix"]
    assert found["host.driver"]["status"] == "skip"


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch not installed (pip install torch==2.13.0)")


def test_cpu_torch_outside_a_gpu_image_fails_cuda_with_its_reason(torch):
    proc = run_probe(env={"GPURIG_CUDA": "13.0", "GPURIG_MIN_DRIVER": "580.65.06"})
    found = records(proc)
    assert proc.returncode == 1
    assert found["torch.import"]["status"] == "pass"
    assert found["cuda.available"]["status"] == "fail"
    if torch.version.cuda is None:
        assert found["cuda.available"]["detail"] == "torch is a CPU-only build"
        assert "CUDA version" in found["cuda.available"]["fix"]
    assert found["cuda.matmul"]["status"] == "skip"


def test_cpu_images_skip_the_gpu_checks(torch):
    proc = run_probe(env={"GPURIG_CUDA": "cpu"})
    found = records(proc)
    assert proc.returncode == 0
    assert found["cuda.available"]["status"] == "skip"
    assert "built for CPU" in found["cuda.available"]["detail"]


def test_text_output_for_humans(torch):
    proc = run_probe("--text", env={"GPURIG_CUDA": "13.0"})
    assert "FAIL  cuda.available" in proc.stdout and "fix:" in proc.stdout

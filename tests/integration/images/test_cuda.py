"""CUDA images: slim with the real CUDA torch wheel from the index, full with the CUDA toolkit from pip wheels."""

from __future__ import annotations

import pytest
from conftest import CUDA, CUDA_TORCH, probe_records, run_in

EXTENSION = r'''
import os, tempfile
from pathlib import Path
from torch.utils.cpp_extension import load
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0")  # compiling needs no GPU, only a target
src = Path(tempfile.mkdtemp())
# The kernel's file includes no torch header (nvcc over torch's headers takes minutes on 2 cores).
(src / "add_one.cu").write_text("""
__global__ void add_one_kernel(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
void add_one(float* x, int n) { add_one_kernel<<<(n + 255) / 256, 256>>>(x, n); }
""")
(src / "binding.cpp").write_text("""
#include <torch/extension.h>
void add_one(float* x, int n);
void add_one_(torch::Tensor x) { add_one(x.data_ptr<float>(), static_cast<int>(x.numel())); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add_one_", &add_one_); }
""")
module = load("gpurig_add_one", [str(src / "binding.cpp"), str(src / "add_one.cu")], build_directory=str(src))
print("compiled", hasattr(module, "add_one_"))
'''

pytestmark = pytest.mark.slow


def test_cuda_slim_has_cuda_torch_and_nvidia_libraries(build):
    image = build("slim", CUDA)
    assert image.report["torch_resolved"] == f"torch=={CUDA_TORCH}"
    assert any(line.startswith("nvidia-cublas") for line in image.report["pip_freeze"])
    probe = (
        "import glob, torch; print(torch.version.cuda); "
        "print(len(glob.glob('/opt/venv/lib/python3.11/site-packages/nvidia/**/libcublas*.so*', recursive=True)))"
    )
    proc = run_in(image.ref, "python", "-W", "ignore", "-c", probe)
    assert proc.returncode == 0, proc.stderr
    cuda_version, cublas = proc.stdout.split()
    assert cuda_version.startswith(CUDA) and int(cublas) > 0


def test_cuda_slim_probe_fails_clearly_without_a_gpu(build):
    proc = run_in(build("slim", CUDA).ref, "python", "-W", "ignore", "/opt/gpurig/checks/verify_torch.py", "--json")
    records = probe_records(proc.stdout)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert records["torch.cuda_version"]["status"] == "pass" and records["torch.cuda_version"]["expected"] == CUDA  # the image's ENV
    assert records["cuda.available"]["status"] == "fail" and records["cuda.available"]["fix"]


def test_full_has_nvcc_and_compiles_a_cuda_extension(build):
    image = build("full", CUDA)
    proc = run_in(image.ref, "nvcc", "--version")
    assert proc.returncode == 0 and f"release {CUDA}" in proc.stdout, proc.stderr
    proc = run_in(image.ref, "python", "-W", "ignore", "-c", EXTENSION, user="1000", timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("compiled True")

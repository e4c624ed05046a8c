#!/usr/bin/env python3
"""Is PyTorch in this container really usable on its GPUs, and how fast? Verification records as JSON or a table.

The one container probe: every gpurig image carries it as
/opt/gpurig/checks/verify_torch.py (run it there with ``--text``), and
``gpurig verify`` sends it into a container on the command line. Standalone
on purpose (stdlib, plus torch, and pynvml where present), so it imports
nothing of gpurig and keeps its tables inline. Each record is
    {"id", "status": pass|warn|fail|skip, "measured", "expected", "unit", "detail", "fix"}
and ``--json`` prints {"probe": "container", "version": 1, "records": [...]}.
A record whose prerequisite failed is ``skip`` naming it; a container without
a usable GPU gets every GPU record's concrete reason, never a traceback.
The decisions are pure functions of observed facts (tested without a GPU);
the ``observe_*``/``measure_*`` functions only gather those facts.
Exit status: 1 if any record failed, else 0 (2 for bad arguments).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

PROBE = "container"
VERSION = 1
LEVELS = ("quick", "full")
PASS_FRACTION = 0.70  # of the datasheet peak: NVIDIA's best GEMMs reach ~80-87% (gpu-facts.md, table 3)
MIN_SHM = 1 << 30  # DataLoader workers hand every batch over through /dev/shm
DOCKER_DEFAULT_SHM = 64 << 20

# CUDA toolkit -> minimum Linux driver (NVIDIA CUDA Toolkit Release Notes, "CUDA Toolkit and
# Corresponding Driver Versions"; the same rows as gpurig/image/compat.py CUDA_RELEASES, copied: no import).
MIN_DRIVER = (
    ("11.8", "520.61.05"),
    ("12.0", "525.60.13"),
    ("12.1", "530.30.02"),
    ("12.2", "535.54.03"),
    ("12.4", "550.54.14"),
    ("12.6", "560.28.03"),
    ("12.8", "570.26"),
    ("12.9", "575.51.03"),
    ("13.0", "580.65.06"),
)

# Dense (no sparsity) peaks: (regex on the name torch reports, label, BF16 TFLOP/s, TF32 TFLOP/s, memory GB/s).
# BF16 and bandwidth: ../shared/reference/gpu-facts.md table 3. TF32 (dense, half the sparse figure)
# and the H100 PCIe row: NVIDIA's datasheets. A variant with other figures (A100 40GB or PCIe, H100 NVL,
# H200 NVL, GH200) matches no row and gets no verdict rather than another GPU's peak.
GPU_PEAKS = (
    (r"\bH100 PCIe\b", "H100 PCIe", 756.0, 378.0, 2000.0),
    (r"^(NVIDIA )?H200\b(?!.*\bNVL\b)", "H200 SXM", 989.0, 494.5, 4800.0),
    (r"^(NVIDIA )?H100\b(?!.*\b(NVL|PCIe)\b)", "H100 SXM", 989.0, 494.5, 3350.0),
    (r"\bA100-SXM4-80GB\b|\bA100 80GB SXM\b", "A100 80GB SXM", 312.0, 156.0, 2039.0),
    (r"\bL40S\b", "L40S", 362.0, 183.0, 864.0),
    (r"\bRTX 4090\b", "RTX 4090", 165.0, 82.6, 1008.0),
)

UTILISATION_MEANING = (
    "GPU utilisation is the share of time at least one kernel was running (one tiny kernel reads 100%); "
    "SM activity is the fraction of SMs with work resident, averaged over all SMs (>= 0.8 needed for efficient use)"
)
SHM_FIX = "start the container with a larger /dev/shm: shm_size: 16g in gpurig_containers (docker run --shm-size 16g, or --ipc host)"


def record(rid, status, measured=None, expected=None, unit="", detail="", fix=""):
    return {"id": rid, "status": status, "measured": measured, "expected": expected, "unit": unit, "detail": detail, "fix": fix}


def skipped(rid, because):
    return record(rid, "skip", detail=f"skipped: needs {because}")


# ---- decisions: pure functions of observed facts -------------------------------------------------


def version_key(version):
    out = []
    for part in str(version).split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def min_driver_for(cuda):
    """The minimum driver for CUDA 'X.Y' (an unknown newer minor takes its major's newest row), or None."""
    if not cuda:
        return None
    minor = ".".join(str(cuda).split(".")[:2])
    for row, driver in MIN_DRIVER:
        if row == minor:
            return driver
    same_major = [r for r in MIN_DRIVER if r[0].split(".")[0] == minor.split(".")[0] and version_key(r[0]) <= version_key(minor)]
    return same_major[-1][1] if same_major else None


def newest_cuda_for(driver):
    """The newest CUDA in the table whose minimum this driver meets, or None."""
    fitting = [cuda for cuda, floor in MIN_DRIVER if version_key(driver) >= version_key(floor)]
    return fitting[-1] if fitting else None


def driver_too_old(cuda, driver):
    """(detail, fix) when ``driver`` is older than CUDA ``cuda`` needs, else None."""
    floor = min_driver_for(cuda)
    if not floor or not driver or version_key(driver) >= version_key(floor):
        return None
    older = newest_cuda_for(driver)
    alt = f", or use an image built for CUDA {older}" if older else ""
    return (
        f"host driver too old for CUDA {cuda}: driver {driver} < {floor}",
        f"upgrade the host driver to >= {floor} (gpurig provision){alt}",
    )


def why_no_cuda(torch_cuda, device_nodes, driver, init_error):
    """(detail, fix) saying why torch sees no GPU, from what the container shows; most specific first."""
    if torch_cuda is None:
        return (
            "CPU-only torch in the image (torch.version.cuda is None)",
            "rebuild the image with a CUDA entry: gpurig build --cuda X.Y",
        )
    if not device_nodes:
        if driver is None:
            return (
                "no NVIDIA driver on the host and no /dev/nvidia* device nodes in the container",
                "install the driver on the host (gpurig provision), then start the container with GPUs",
            )
        return (
            "container started without GPUs: no /dev/nvidia* device nodes",
            "add --gpus all (docker run) / gpus: in gpurig_containers, then redeploy",
        )
    text = (init_error or "").strip()
    low = text.lower()
    if "insufficient" in low or "too old" in low:
        old = driver_too_old(torch_cuda, driver)
        if old:
            return old
        floor = min_driver_for(torch_cuda) or "the CUDA minimum"
        return (f"host driver too old for CUDA {torch_cuda}: {first_line(text)}", f"upgrade the host driver to >= {floor}")
    if "version mismatch" in low:
        return (
            f"kernel module and user-space driver library differ: {first_line(text)}",
            "reboot the host (or reload the nvidia module) after the driver upgrade",
        )
    if "unsupported display driver" in low or "forward compatibility" in low:
        return (
            f"CUDA forward-compatibility library does not match this GPU/driver: {first_line(text)}",
            "remove the cuda-compat package from the image, or upgrade the host driver",
        )
    if "no nvidia driver" in low or "libcuda" in low or driver is None:
        return (
            f"device nodes present but the driver library is not usable: {first_line(text) or 'no libcuda.so'}",
            "start the container through the nvidia runtime (gpus: in gpurig_containers; gpurig provision installs it)",
        )
    old = driver_too_old(torch_cuda, driver)
    if old:
        return old
    return (
        f"CUDA initialisation failed: {first_line(text) or 'torch.cuda.is_available() is False'}",
        "run nvidia-smi inside the container and on the host; see dmesg for Xid errors",
    )


def first_line(text):
    lines = [ln.strip() for ln in str(text or "").splitlines() if ln.strip()]
    return lines[0][:300] if lines else ""


def cuda_version_record(torch_cuda, expected):
    rid = "torch.cuda_version"
    got = torch_cuda or "cpu"
    if not expected:
        return record(rid, "pass", got, None, "", "no io.gpurig.cuda label given to compare with")
    if got == expected:
        return record(rid, "pass", got, expected, "", "torch's CUDA build matches the image's io.gpurig.cuda label")
    return record(
        rid, "fail", got, expected, "",
        f"the image is labelled CUDA {expected} but its torch is built for {got}",
        "rebuild the image (gpurig build) so that torch and its io.gpurig.cuda label agree",
    )


def arch_record(capability, arch_list, gpu_name=""):
    """Whether torch carries code for this GPU: its sm_XY, an older sm of the same major, or PTX to JIT."""
    rid = "cuda.arch"
    major, minor = capability
    sm = f"sm_{major}{minor}"
    archs = list(arch_list or ())
    where = f"{gpu_name} is {sm}" if gpu_name else sm
    if sm in archs:
        return record(rid, "pass", sm, "in torch.cuda.get_arch_list()", "", f"{where}; torch carries kernels for it")
    same_major = [a for a in archs if a.startswith(f"sm_{major}") and _arch_num(a) is not None and _arch_num(a) // 10 == major
                  and _arch_num(a) <= major * 10 + minor]
    if same_major:
        return record(rid, "pass", sm, "in torch.cuda.get_arch_list()", "",
                      f"{where}; runs {same_major[-1]} kernels (binary compatible within a major version)")
    ptx = [a for a in archs if a.startswith("compute_") and _arch_num(a) is not None and _arch_num(a) <= major * 10 + minor]
    fix = "use a torch build (newer torch/CUDA entry) whose arch list includes " + sm
    if ptx:
        return record(rid, "warn", sm, "in torch.cuda.get_arch_list()", "",
                      f"{where}; only {ptx[-1]} PTX: kernels are JIT-compiled at start (slow first run)", fix)
    return record(rid, "fail", sm, "in torch.cuda.get_arch_list()", "",
                  f"{where} but torch is built for {', '.join(archs) or 'no GPU architecture'}", fix)


def _arch_num(arch):
    digits = arch.split("_", 1)[-1].rstrip("a").rstrip("f")
    return int(digits) if digits.isdigit() else None


def shm_record(size_bytes, path="/dev/shm"):
    rid = "shm.size"
    expected = f">= {MIN_SHM >> 20}"
    if size_bytes is None:
        return record(rid, "warn", None, expected, "MiB", f"cannot read the size of {path}", SHM_FIX)
    mib = size_bytes >> 20
    if size_bytes <= DOCKER_DEFAULT_SHM:
        return record(
            rid, "fail", mib, expected, "MiB",
            f"{path} is Docker's {DOCKER_DEFAULT_SHM >> 20} MB default: DataLoader workers pass batches through it "
            "and die with 'bus error' / 'unable to write to file </torch_...>' once batches outgrow it",
            SHM_FIX,
        )
    if size_bytes < MIN_SHM:
        return record(rid, "warn", mib, expected, "MiB",
                      f"{path} is under 1 GiB: DataLoader workers with large batches may run out of it", SHM_FIX)
    return record(rid, "pass", mib, expected, "MiB", f"{path} is large enough for DataLoader workers")


def peak_for(gpu_name):
    """The GPU_PEAKS row for a device name, or None."""
    for pattern, label, bf16, tf32, membw in GPU_PEAKS:
        if re.search(pattern, str(gpu_name).strip(), re.IGNORECASE):
            return {"label": label, "bf16": bf16, "tf32": tf32, "membw": membw}
    return None


def throughput_record(rid, measured, peak, unit, what, gpu_name=""):
    """Achieved vs the datasheet peak: pass at >= PASS_FRACTION, the fraction always said."""
    if peak is None:
        return record(rid, "warn", round(measured, 1), None, unit,
                      f"{what}: no peak known for {gpu_name or 'this GPU'}, so no verdict",
                      "add the GPU's datasheet row to GPU_PEAKS in checks/verify_torch.py")
    fraction = measured / peak
    status = "pass" if fraction >= PASS_FRACTION else "fail"
    detail = f"{fraction:.0%} of the {peak:g} {unit} peak (pass >= {PASS_FRACTION:.0%}); {what}"
    fix = "" if status == "pass" else (
        "check clocks and throttling (gpurig verify's host records, nvidia-smi -q -d PERFORMANCE) and other processes on the GPU")
    return record(rid, status, round(measured, 1), peak, unit, detail, fix)


def kernel_record(max_rel_error, tolerance, what):
    rid = "cuda.kernel_correct"
    if max_rel_error <= tolerance:
        return record(rid, "pass", float(f"{max_rel_error:.2e}"), f"<= {tolerance:g}", "max rel. error", f"{what} equals the CPU's result")
    return record(rid, "fail", float(f"{max_rel_error:.2e}"), f"<= {tolerance:g}", "max rel. error",
                  f"{what} differs from the CPU's result: the GPU computes wrong answers",
                  "check the host's ECC and Xid records (gpurig verify without --container), then drain the GPU")


def training_record(samples_per_s, util, sm_activity, why_no_sm, gpu_name):
    util_text = f"GPU utilisation {util:.0%}" if util is not None else "GPU utilisation not available (no NVML binding, no nvidia-smi)"
    sm_text = f"SM activity {sm_activity:.0%}" if sm_activity is not None else f"SM activity not available ({why_no_sm})"
    return record("training", "pass", round(samples_per_s, 1), None, "samples/s",
                  f"small transformer, AMP bf16 on {gpu_name}; {util_text}, {sm_text}. {UTILISATION_MEANING}")


def worst(records):
    order = {"fail": 3, "warn": 2, "pass": 1, "skip": 0}
    return max((r["status"] for r in records), key=lambda s: order.get(s, 0), default="skip")


# ---- observations: facts from this container --------------------------------------------------


def device_nodes():
    return sorted(p for p in glob.glob("/dev/nvidia*") if os.path.basename(p)[6:].isdigit())


def host_driver():
    """The driver the kernel module reports (visible inside containers too), or None."""
    try:
        with open("/proc/driver/nvidia/version") as fh:
            text = fh.read()
    except OSError:
        return None
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return word
    return None


def shm_size(path="/dev/shm"):
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def cuda_init_error(torch):
    """The text torch gives when CUDA cannot start (is_available() swallows it)."""
    try:
        torch.cuda.init()
    except Exception as err:  # torch raises RuntimeError/AssertionError with the driver's words
        return f"{type(err).__name__}: {err}"
    return None


class DataSet:
    """Tiny batches of random data for the DataLoader record (top level: worker processes pickle it)."""

    def __len__(self):
        return 32

    def __getitem__(self, index):
        import torch

        return torch.full((64, 1024), float(index))


def dataloader_record(torch, cuda):
    rid = "dataloader.workers"
    from torch.utils.data import DataLoader

    start = time.monotonic()
    try:
        # fork: the script may come from stdin, which spawn/forkserver workers cannot re-import
        loader = DataLoader(DataSet(), batch_size=8, num_workers=2, pin_memory=cuda, timeout=60,
                            multiprocessing_context="fork")
        batches = 0
        for batch in loader:
            if cuda and not batch.is_pinned():
                return record(rid, "fail", batches, 4, "batches", "a batch came back unpinned with pin_memory=True")
            batches += 1
    except Exception as err:  # a dying worker surfaces as RuntimeError naming the signal
        text = first_line(err)
        shm = "bus error" in text.lower() or "shm" in text.lower() or "shared memory" in text.lower()
        return record(rid, "fail", None, 4, "batches", f"DataLoader with 2 workers failed: {text}",
                      SHM_FIX if shm else "run the DataLoader with num_workers=0 to see the worker's own error")
    pinned = " with pin_memory" if cuda else " (pin_memory off: no CUDA)"
    return record(rid, "pass", batches, 4, "batches", f"2 worker processes{pinned}, {time.monotonic() - start:.1f}s")


# ---- measurements on the GPU ------------------------------------------------------------------


def timed(torch, fn, reps, warmup=2):
    """Median seconds of ``fn`` over ``reps`` runs, after warm-up, timed by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    return statistics.median(times)


def measure_kernel(torch, devices, n=1024):
    """The worst relative error of a float32 matmul plus elementwise op on each GPU vs the CPU."""
    torch.manual_seed(0)
    a, b = torch.randn(n, n), torch.randn(n, n)
    want = torch.relu(a @ b) * 0.5 + a
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # TF32 differs from the CPU by design
    try:
        worst_err = 0.0
        for d in devices:
            ga, gb = a.to(d), b.to(d)
            got = (torch.relu(ga @ gb) * 0.5 + ga).cpu()
            worst_err = max(worst_err, float((got - want).abs().max() / want.abs().max()))
        return worst_err
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def measure_matmul(torch, device, dtype, n=8192, reps=10):
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    with torch.cuda.device(device):
        seconds = timed(torch, lambda: torch.matmul(a, b, out=c), reps)
    return 2 * n**3 / seconds / 1e12


def measure_membw(torch, device, nbytes=1 << 30, reps=10):
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    with torch.cuda.device(device):
        seconds = timed(torch, lambda: dst.copy_(src), reps)
    return 2 * nbytes / seconds / 1e9  # bytes read plus bytes written


def measure_pcie(torch, device, nbytes=256 << 20, reps=5):
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=device)
    with torch.cuda.device(device):
        h2d = timed(torch, lambda: gpu.copy_(host, non_blocking=True), reps)
        d2h = timed(torch, lambda: host.copy_(gpu, non_blocking=True), reps)
    return nbytes / h2d / 1e9, nbytes / d2h / 1e9


def measure_allreduce(torch, devices, numel=16 << 20, reps=5):
    """(correct, bus GB/s) of a single-process NCCL all-reduce across ``devices``."""
    nccl = torch.cuda.nccl  # torch.cuda imports it; through the torch given, like every other call here
    n = len(devices)
    tensors = [torch.full((numel,), float(i + 1), device=d) for i, d in enumerate(devices)]
    nccl.all_reduce(tensors)
    for d in devices:
        torch.cuda.synchronize(d)
    want = n * (n + 1) / 2
    correct = all(bool((t == want).all()) for t in tensors)
    start = time.perf_counter()
    for _ in range(reps):
        nccl.all_reduce(tensors)
    for d in devices:
        torch.cuda.synchronize(d)
    seconds = (time.perf_counter() - start) / reps
    return correct, numel * 4 * 2 * (n - 1) / n / seconds / 1e9


class Utilisation:
    """NVML samples while the training loop runs: utilisation (kernel running) and GPM SM activity (Hopper+)."""

    def __init__(self, index, uuid=None):
        self.index, self.uuid, self.util, self.sm, self.why_no_sm = index, uuid, [], [], ""
        self._stop = threading.Event()
        self._thread = None
        self.smi = shutil.which("nvidia-smi")  # the toolkit mounts it into GPU containers (utility capability)
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            # by UUID: NVML's index and CUDA's differ when the container sees a subset of the GPUs
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as err:  # ImportError, or NVML missing in the container
            self.nvml = None
            self.why_no_sm = f"no NVML binding in the container ({first_line(err) or type(err).__name__}): pip install nvidia-ml-py"

    def __enter__(self):
        run = self._run if self.nvml is not None else self._run_smi if self.smi else None
        if run is not None:
            self._thread = threading.Thread(target=run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _gpm_supported(self):
        try:
            return bool(self.nvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice)
        except Exception:
            return False

    def _run(self):
        nvml, gpm = self.nvml, self._gpm_supported()
        if not gpm:
            self.why_no_sm = "NVML GPM metrics need a Hopper or newer GPU and driver"
        prev = None
        while not self._stop.wait(0.2):
            try:
                self.util.append(nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu / 100.0)
            except Exception:
                pass
            if gpm:
                prev = self._gpm_step(prev)

    def _run_smi(self):
        """Utilisation only, from nvidia-smi's query (its text is no stable interface; its CSV query is)."""
        target = ["-i", self.uuid] if self.uuid else ["-i", str(self.index)]
        while not self._stop.wait(0.5):
            try:
                out = subprocess.run([self.smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", *target],
                                     capture_output=True, text=True, timeout=5).stdout.strip()
                self.util.append(int(out.splitlines()[0]) / 100.0)
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                pass

    def _gpm_step(self, prev):
        nvml = self.nvml
        try:
            sample = nvml.nvmlGpmSampleAlloc()
            nvml.nvmlGpmSampleGet(self.handle, sample)
        except Exception as err:
            self.why_no_sm = f"GPM sample failed: {first_line(err)}"
            return prev
        if prev is not None:
            try:
                req = nvml.c_nvmlGpmMetricsGet_t()
                req.version = nvml.NVML_GPM_METRICS_GET_VERSION
                req.numMetrics = 1
                req.sample1, req.sample2 = prev, sample
                req.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
                self.sm.append(nvml.nvmlGpmMetricsGet(req).metrics[0].value / 100.0)
            except Exception as err:
                self.why_no_sm = f"GPM metrics failed: {first_line(err)}"
            finally:
                nvml.nvmlGpmSampleFree(prev)
        return sample

    def means(self):
        mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
        return mean(self.util), mean(self.sm), self.why_no_sm or "no samples"


def measure_training(torch, device, seconds=15.0, batch=32, seq=256, width=512, layers=4):
    """Samples/s of a small transformer trained with AMP bf16, and NVML's view of the GPU meanwhile."""
    nn = torch.nn
    layer = nn.TransformerEncoderLayer(width, 8, 4 * width, batch_first=True, dropout=0.0)
    model = nn.Sequential(nn.Embedding(32000, width), nn.TransformerEncoder(layer, layers), nn.Linear(width, 32000)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 32000, (batch, seq), device=device)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize(device)
    with Utilisation(device.index or 0, _uuid(torch, device)) as sampler:
        start, steps = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            step()
            steps += 1
            if steps % 10 == 0:
                torch.cuda.synchronize(device)
        torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
    return (steps * batch / elapsed, *sampler.means())


# ---- the run ----------------------------------------------------------------------------------


GPU_QUICK = ("cuda.devices", "cuda.arch", "cuda.kernel_correct")
GPU_FULL = ("matmul.bf16", "matmul.tf32", "membw", "pcie.h2d", "pcie.d2h", "nccl.allreduce", "training")


def run(level="quick", expect_cuda=None):
    """Every record of ``level``, in order: torch, CUDA, kernels, (speed), shm, DataLoader."""
    records = []
    start = time.monotonic()
    try:
        import torch
    except Exception as err:  # ImportError, or a CUDA library that fails to load
        records.append(record("torch.import", "fail", None, "importable", "", f"{type(err).__name__}: {first_line(err)}",
                              "install torch in the image's Python (gpurig images carry it in /opt/venv)"))
        records.append(shm_record(shm_size()))
        return records
    records.append(record("torch.import", "pass", torch.__version__, None, "",
                          f"imported in {time.monotonic() - start:.1f}s; CUDA build {torch.version.cuda or 'none (CPU-only)'}"))
    records.append(cuda_version_record(torch.version.cuda, expect_cuda))
    records += gpu_records(torch, level)
    records.append(shm_record(shm_size()))
    records.append(dataloader_record(torch, cuda=torch.cuda.is_available()))
    return records


def gpu_records(torch, level):
    wanted = GPU_QUICK + (GPU_FULL if level == "full" else ())
    if not torch.cuda.is_available():
        init_error = cuda_init_error(torch) if torch.version.cuda else None
        detail, fix = why_no_cuda(torch.version.cuda, device_nodes(), host_driver(), init_error)
        return [record("cuda.available", "fail", False, True, "", detail, fix)] + [skipped(r, "cuda.available") for r in wanted]
    devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    names = [torch.cuda.get_device_name(d) for d in devices]
    out = [record("cuda.available", "pass", True, True, "", f"{len(devices)} GPU(s), CUDA {torch.version.cuda}, driver {host_driver() or '?'}")]
    uuids = [_uuid(torch, d) for d in devices]
    out.append(record("cuda.devices", "pass", uuids, None, "", "; ".join(f"{i}: {n}" for i, n in enumerate(names))))
    kinds = {(torch.cuda.get_device_capability(d), n) for d, n in zip(devices, names)}  # mixed GPUs: each kind once
    archs = [arch_record(cap, torch.cuda.get_arch_list(), n) for cap, n in sorted(kinds)]
    out.append(next((r for r in archs if r["status"] == worst(archs)), archs[0]))
    if out[-1]["status"] == "fail":
        return out + [skipped(r, "cuda.arch") for r in wanted if r not in ("cuda.devices", "cuda.arch")]
    out.append(_guard("cuda.kernel_correct", lambda: kernel_record(measure_kernel(torch, devices), 1e-4,
                                                                   f"a 1024x1024 float32 matmul + relu on {len(devices)} GPU(s)")))
    if level != "full":
        return out
    if out[-1]["status"] == "fail":
        return out + [skipped(r, "cuda.kernel_correct") for r in GPU_FULL]
    return out + full_records(torch, devices, names)


def full_records(torch, devices, names):
    peak = peak_for(names[0])
    label = names[0] if len(set(names)) == 1 else ", ".join(names)
    each = f" (slowest of {len(devices)} GPUs)" if len(devices) > 1 else ""
    out = []

    def matmul(dtype, key, what):
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = key == "tf32"
        try:
            got = min(measure_matmul(torch, d, dtype) for d in devices)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
        return throughput_record(f"matmul.{key}", got, peak and peak[key], "TFLOP/s", what + each, label)

    out.append(_guard("matmul.bf16", lambda: matmul(torch.bfloat16, "bf16", "8192^3 bf16 matmul, median of 10")))
    out.append(_guard("matmul.tf32", lambda: matmul(torch.float32, "tf32", "8192^3 fp32 matmul with TF32, median of 10")))
    out.append(_guard("membw", lambda: throughput_record(
        "membw", min(measure_membw(torch, d) for d in devices), peak and peak["membw"], "GB/s",
        "1 GiB device-to-device copy, bytes read + written" + each, label)))
    try:
        speeds = [measure_pcie(torch, d) for d in devices]
        for i, key in enumerate(("h2d", "d2h")):
            got = min(s[i] for s in speeds)
            out.append(record(f"pcie.{key}", "pass", round(got, 1), None, "GB/s",
                              f"256 MiB pinned {'host to device' if key == 'h2d' else 'device to host'}{each}"))
    except Exception as err:
        out += [_error(f"pcie.{k}", err) for k in ("h2d", "d2h")]
    if len(devices) < 2:
        out.append(record("nccl.allreduce", "skip", None, None, "", "one GPU: nothing to all-reduce across"))
    else:
        out.append(_guard("nccl.allreduce", lambda: _allreduce_record(torch, devices)))
    out.append(_guard("training", lambda: training_record(*measure_training(torch, devices[0]), names[0])))
    return out


def _allreduce_record(torch, devices):
    correct, busbw = measure_allreduce(torch, devices)
    if not correct:
        return record("nccl.allreduce", "fail", round(busbw, 1), None, "GB/s",
                      f"all-reduce across {len(devices)} GPUs gave a wrong sum",
                      "check NVLink/PCIe health (nvidia-smi topo -m, nvidia-smi nvlink -s) and NCCL_P2P_DISABLE=1 as a test")
    return record("nccl.allreduce", "pass", round(busbw, 1), None, "GB/s",
                  f"64 MiB float32 across {len(devices)} GPUs: correct sum; bus bandwidth")


def _guard(rid, make):
    try:
        return make()
    except Exception as err:  # an out-of-memory or a CUDA error is this record's failure, not the probe's
        return _error(rid, err)


def _error(rid, err):
    return record(rid, "fail", None, None, "", f"{type(err).__name__}: {first_line(err)}",
                  "see dmesg on the host for Xid errors; run nvidia-smi in the container")


def _uuid(torch, device):
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


# ---- output -----------------------------------------------------------------------------------


def document(records):
    return {"probe": PROBE, "version": VERSION, "records": records}


def text_table(records):
    """An aligned table: status, id, measured (with unit) and expected, then detail and fix lines."""
    def cell(r, key):
        value = r[key]
        if value is None:
            return "-"
        shown = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
        return f"{shown} {r['unit']}".strip() if key == "measured" and r["unit"] else shown

    rows = [(r["status"].upper(), r["id"], cell(r, "measured"), cell(r, "expected")) for r in records]
    widths = [max(len(row[i]) for row in rows + [("STATUS", "ID", "MEASURED", "EXPECTED")]) for i in range(4)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format("STATUS", "ID", "MEASURED", "EXPECTED").rstrip()]
    for r, row in zip(records, rows):
        lines.append(fmt.format(*row).rstrip())
        if r["detail"]:
            lines.append(" " * (widths[0] + 2) + r["detail"])
        if r["fix"]:
            lines.append(" " * (widths[0] + 2) + "fix: " + r["fix"])
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="verify_torch.py",
        description="Verify PyTorch on this container's GPUs: torch, CUDA, kernels, speed vs peak, /dev/shm, DataLoader.",
        epilog="In a gpurig image: python /opt/gpurig/checks/verify_torch.py --text. By hand into any container:"
               " docker exec -i NAME python3 - --text < checks/verify_torch.py",
    )
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help='print {"probe", "version", "records"} as JSON')
    out.add_argument("--text", action="store_true", help="print an aligned table (the default)")
    parser.add_argument("--level", choices=LEVELS, default="quick",
                        help="quick: presence and correctness (seconds); full: adds TFLOP/s, bandwidths, NCCL, training")
    parser.add_argument("--expect-cuda", metavar="X.Y", default=os.environ.get("GPURIG_CUDA") or None,
                        help="the image's io.gpurig.cuda label (cpu for a CPU image); default: $GPURIG_CUDA, set in gpurig images")
    args = parser.parse_args(argv)
    records = run(args.level, args.expect_cuda)
    if args.json:
        sys.stdout.write(json.dumps(document(records)) + "\n")
    else:
        sys.stdout.write(text_table(records))
    sys.stdout.flush()
    return 1 if any(r["status"] == "fail" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())

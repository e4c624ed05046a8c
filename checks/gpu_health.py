#!/usr/bin/env python3
"""Is this container's PyTorch really using a GPU? One JSON record per check, on stdout.

Standalone on purpose (stdlib, plus torch when present): it is copied into
every image and piped to hosts, so it depends on nothing of gpurig. Each record is
    {"id", "status": pass|warn|fail|skip, "measured", "expected", "detail", "fix"}
The exit status is 1 if any check failed, else 0. `--text` prints a table instead.
"""

from __future__ import annotations

import glob
import json
import os
import sys

MIN_SHM_BYTES = 1 << 30  # DataLoader workers pass batches through /dev/shm


def record(check_id, status, measured=None, expected=None, detail="", fix=""):
    return {"id": check_id, "status": status, "measured": measured, "expected": expected, "detail": detail, "fix": fix}


def check_shm(path="/dev/shm"):
    try:
        stat = os.statvfs(path)
    except OSError as err:
        return record("host.shm", "warn", None, f">= {MIN_SHM_BYTES >> 20} MiB", f"cannot read {path}: {err}")
    size = stat.f_frsize * stat.f_blocks
    if size < MIN_SHM_BYTES:
        return record(
            "host.shm",
            "warn",
            f"{size >> 20} MiB",
            f">= {MIN_SHM_BYTES >> 20} MiB",
            "/dev/shm is small: DataLoader workers (num_workers > 0) crash with 'bus error' or 'shm' errors",
            "start the container with --shm-size=16g (or --ipc=host)",
        )
    return record("host.shm", "pass", f"{size >> 20} MiB", f">= {MIN_SHM_BYTES >> 20} MiB")


def driver_version():
    """The host driver as the kernel module reports it, or None when no NVIDIA driver is visible."""
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


def _key(version):
    return tuple(int(p) for p in version.split("."))


def check_driver():
    needed = os.environ.get("GPURIG_MIN_DRIVER", "none")
    found = driver_version()
    if found is None:
        return record("host.driver", "skip", None, needed, "no NVIDIA driver visible (/proc/driver/nvidia/version)")
    if needed != "none" and _key(found) < _key(needed):
        return record(
            "host.driver",
            "fail",
            found,
            f">= {needed}",
            f"the host driver {found} is older than CUDA {os.environ.get('GPURIG_CUDA')} of this image needs",
            f"upgrade the host's NVIDIA driver to {needed} or newer, or use an image built for an older CUDA",
        )
    return record("host.driver", "pass", found, f">= {needed}" if needed != "none" else None)


def why_no_cuda(torch):
    """The most likely reason torch sees no GPU, and what to do, from what this container can see."""
    if torch.version.cuda is None:
        return "torch is a CPU-only build", "build the image for a CUDA version (matrix cuda: 12.8, 13.0, ...)"
    devices = glob.glob("/dev/nvidia[0-9]*")
    visible = os.environ.get("NVIDIA_VISIBLE_DEVICES")
    if not devices and driver_version() is None:
        if os.path.exists("/.dockerenv") or visible is not None:
            return (
                "no NVIDIA device or driver in this container",
                "start it with --gpus all (host needs the NVIDIA Container Toolkit: invoke provision)",
            )
        return "no NVIDIA GPU or driver on this machine", "run on a host with an NVIDIA GPU and driver"
    if not devices:
        return "the driver is visible but no /dev/nvidiaN device", "start the container with --gpus all"
    try:
        torch.cuda.init()
    except Exception as err:  # torch reports the driver/runtime mismatch only here
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "insufficient" in text or "too old" in text:
            return text, f"upgrade the host driver to >= {os.environ.get('GPURIG_MIN_DRIVER', 'the CUDA minimum')}"
        return text, "check `nvidia-smi` on the host and inside the container"
    return "torch.cuda.is_available() is False", "check `nvidia-smi` inside the container"


def torch_checks():
    try:
        import torch
    except Exception as err:  # ImportError, or a broken CUDA library load
        return [
            record(
                "torch.import",
                "fail",
                None,
                "importable",
                f"{type(err).__name__}: {err}",
                "install torch in this environment (gpurig images carry it in /opt/venv)",
            )
        ]
    out = [record("torch.import", "pass", torch.__version__, None, f"CUDA build: {torch.version.cuda or 'none (CPU)'}")]
    built_for_cpu = os.environ.get("GPURIG_CUDA") == "cpu"
    if built_for_cpu:
        out.append(record("cuda.available", "skip", False, None, "this image was built for CPU (cuda: cpu)"))
        return out
    if not torch.cuda.is_available():
        reason, fix = why_no_cuda(torch)
        out.append(record("cuda.available", "fail", False, True, reason, fix))
        out.append(record("cuda.matmul", "skip", None, None, "no CUDA device"))
        return out
    count = torch.cuda.device_count()
    names = [torch.cuda.get_device_name(i) for i in range(count)]
    out.append(record("cuda.available", "pass", True, True, f"CUDA {torch.version.cuda}"))
    expected = os.environ.get("GPURIG_EXPECT_GPUS")
    status = "fail" if expected and int(expected) != count else "pass"
    out.append(
        record(
            "cuda.devices",
            status,
            count,
            int(expected) if expected else None,
            ", ".join(names),
            "check NVIDIA_VISIBLE_DEVICES / --gpus and `nvidia-smi -L` on the host" if status == "fail" else "",
        )
    )
    out.append(matmul_check(torch))
    return out


def matmul_check(torch, n=1024):
    """A matmul on every GPU must match the CPU's result: proves kernels really run, not just that a device exists."""
    torch.manual_seed(0)
    a, b = torch.randn(n, n), torch.randn(n, n)
    want = a @ b
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # TF32 would differ from the CPU by design
    worst = 0.0
    try:
        for index in range(torch.cuda.device_count()):
            device = torch.device("cuda", index)
            got = (a.to(device) @ b.to(device)).cpu()
            worst = max(worst, float((got - want).abs().max() / want.abs().max()))
    except Exception as err:
        return record("cuda.matmul", "fail", None, "runs", f"{type(err).__name__}: {err}", "see `nvidia-smi` and dmesg")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    status = "pass" if worst < 1e-3 else "fail"
    return record(
        "cuda.matmul",
        status,
        f"max relative error {worst:.2e}",
        "< 1e-3",
        f"{n}x{n} float32 on {torch.cuda.device_count()} GPU(s) vs CPU",
        "" if status == "pass" else "the GPU computes wrong results: check `nvidia-smi -q` for ECC/Xid errors",
    )


def run_all():
    return [check_shm(), check_driver(), *torch_checks()]


def main(argv):
    records = run_all()
    if "--text" in argv:
        for r in records:
            print(f"{r['status'].upper():5} {r['id']:16} {r['measured']!s:24} {r['detail']}")
            if r["fix"]:
                print(f"      fix: {r['fix']}")
    else:
        for r in records:
            print(json.dumps(r))
    return 1 if any(r["status"] == "fail" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

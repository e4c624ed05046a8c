#!/usr/bin/env python3
"""Capture a real NVIDIA GPU host as test fixtures, and its figures as a table, in one command.

    python3 bench/gpu_capture.py --out DIR        # or OUT=DIR python3 bench/gpu_capture.py

Needs a plain Python with torch (a CUDA build) and nvidia-ml-py on a machine
with an NVIDIA driver; no Docker, no gpurig installed. It runs gpurig's own
probes from this checkout's checks/, exactly as gpurig sends them to hosts:

- ``nvidia-smi -q -x``                      -> nvidia-smi-q.xml (+ /proc/driver/nvidia/version)
- checks/verify_host.py --json              -> verify-host.json
- checks/verify_torch.py --json --level full -> verify-torch-full.json
- checks/gpu_sampler.py under a matmul load -> sampler-matmul.jsonl
- checks/gpu_sampler.py under a tiny-kernel load -> sampler-tiny.jsonl

then writes figures.md (TFLOP/s and bandwidth against the datasheet peak, what
utilisation and SM activity read under each load) and manifest.json (what ran,
what was skipped and why). Eight files at most: what the project's device tool
brings back from $OUT. On a machine without a GPU every step is skipped with
its reason, the list is printed, and the exit status is 0; a step that ran and
broke makes it 1. Copy the folder to tests/fixtures/gpu/<name>/ (the name is in
manifest.json) and the unit tests replay it. Standard library only: it imports
torch for the loads, never gpurig.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ROOT / "checks"
PROC_VERSION = Path("/proc/driver/nvidia/version")
MANIFEST = "manifest.json"
FIGURES = "figures.md"
LOADS = (("matmul", "8192x8192 bf16 matmuls back to back"), ("tiny", "one 32-element add kernel at a time"))
SAMPLE_INTERVAL_S = 0.25
SAMPLE_SECONDS = 6.0
# The torch probe's full level measures for about a minute on one GPU; a hung driver must not hold the capture for ever.
TIMEOUTS = {"smi": 60, "host": 180, "torch": 900, "sampler": 60, "load_start": 120}


class Skip(Exception):
    """A step that cannot run on this machine; the message says why."""


class Failed(Exception):
    """A step that ran and broke; the message says how."""


# ---- what this machine has ---------------------------------------------------------------------


class Machine:
    """What the steps need, found once: the driver, nvidia-smi, torch and whether it reaches a GPU, NVML."""

    def __init__(self) -> None:
        self.smi = shutil.which("nvidia-smi")
        self.proc_version = PROC_VERSION.read_text() if PROC_VERSION.is_file() else None
        self.torch, self.torch_why = _import_torch()
        try:
            import pynvml  # noqa: F401

            self.nvml_why = None
        except ImportError:
            self.nvml_why = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"

    @property
    def driver(self) -> str | None:
        found = re.search(r"\b(\d+\.\d+(?:\.\d+)?)\b", self.proc_version or "")
        return found.group(1) if found else None

    def need_driver(self) -> None:
        if self.proc_version is None:
            raise Skip(f"no NVIDIA driver loaded ({PROC_VERSION} is absent)")

    def need_smi(self) -> None:
        if self.smi is None:
            raise Skip("nvidia-smi is not on PATH")

    def need_cuda(self):
        if self.torch is None:
            raise Skip(self.torch_why)
        return self.torch

    def need_gpu_source(self) -> None:
        if self.nvml_why and self.smi is None:
            raise Skip(f"the sampler would see no GPU: {self.nvml_why}, and nvidia-smi is not on PATH")


def _import_torch():
    """(torch, None) when torch reaches a GPU, else (None, why not)."""
    try:
        import torch
    except Exception as err:  # ImportError, or a CUDA library that fails to load
        return None, f"torch does not import ({type(err).__name__}: {err})"
    if torch.version.cuda is None:
        return None, f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"
    return torch, None


# ---- the steps ---------------------------------------------------------------------------------


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failed(f"{Path(argv[1] if argv[0] == sys.executable else argv[0]).name} did not finish within {timeout:g} s") from None


def _probe_document(proc: subprocess.CompletedProcess, what: str) -> str:
    """The probe's JSON document (its exit status is its verdict, not ours), or Failed saying what it printed instead."""
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise Failed(f"{what} printed no JSON document (exit {proc.returncode}): {said[-1] if said else 'nothing'}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list) or not doc["records"]:
        raise Failed(f"{what} printed a document without records")
    return json.dumps(doc, indent=1) + "\n"


def step_smi(machine: Machine, out: Path) -> list[str]:
    machine.need_smi()
    proc = _run([machine.smi, "-q", "-x"], TIMEOUTS["smi"])
    if proc.returncode != 0 or "<nvidia_smi_log" not in proc.stdout:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        raise Failed(f"nvidia-smi -q -x exited {proc.returncode}: {said[0] if said else 'no output'}")
    (out / "nvidia-smi-q.xml").write_text(proc.stdout)
    return ["nvidia-smi-q.xml"]


def step_host(machine: Machine, out: Path) -> list[str]:
    machine.need_driver()
    proc = _run([sys.executable, str(CHECKS / "verify_host.py"), "--json"], TIMEOUTS["host"])
    (out / "verify-host.json").write_text(_probe_document(proc, "checks/verify_host.py"))
    (out / "proc-driver-nvidia-version.txt").write_text(machine.proc_version or "")
    return ["verify-host.json", "proc-driver-nvidia-version.txt"]


def step_torch(machine: Machine, out: Path) -> list[str]:
    machine.need_cuda()
    proc = _run([sys.executable, str(CHECKS / "verify_torch.py"), "--json", "--level", "full"], TIMEOUTS["torch"])
    (out / "verify-torch-full.json").write_text(_probe_document(proc, "checks/verify_torch.py"))
    return ["verify-torch-full.json"]


class Load(threading.Thread):
    """Runs one load step after another until stopped; ``going`` is set once the first has finished on the GPU."""

    def __init__(self, step) -> None:
        super().__init__(daemon=True)
        self.step, self.stop, self.going, self.error = step, threading.Event(), threading.Event(), None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
                self.going.set()
        except Exception as err:  # an out-of-memory or a CUDA error ends this load's step, said in the manifest
            self.error = err
            self.going.set()


def load_step(torch, kind: str):
    """One unit of load, ending in a synchronize so that the loop never runs ahead of the GPU by more than that."""
    if kind == "matmul":
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b, c = torch.randn_like(a), torch.empty_like(a)

        def matmuls():
            for _ in range(8):
                torch.matmul(a, b, out=c)
            torch.cuda.synchronize()

        return matmuls
    x = torch.zeros(32, device="cuda")

    def tiny():
        for _ in range(2000):
            x.add_(1)
        torch.cuda.synchronize()

    return tiny


def step_sampler(kind: str):
    def step(machine: Machine, out: Path) -> list[str]:
        torch = machine.need_cuda()
        machine.need_gpu_source()
        load = Load(load_step(torch, kind))
        load.start()
        try:
            if not load.going.wait(TIMEOUTS["load_start"]):
                raise Failed(f"the {kind} load did not finish its first step within {TIMEOUTS['load_start']} s")
            argv = [sys.executable, str(CHECKS / "gpu_sampler.py"), "--interval", f"{SAMPLE_INTERVAL_S:g}", "--duration", f"{SAMPLE_SECONDS:g}"]
            proc = _run(argv, TIMEOUTS["sampler"])
        finally:
            load.stop.set()
            load.join(TIMEOUTS["load_start"])
        if load.error is not None:
            raise Failed(f"the {kind} load broke: {type(load.error).__name__}: {load.error}")
        records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not any(r.get("type") == "sample" and r.get("gpus") for r in records):
            said = proc.stderr.strip().splitlines()
            raise Failed(f"checks/gpu_sampler.py gave no GPU samples (exit {proc.returncode}): {said[-1] if said else 'no error printed'}")
        name = f"sampler-{kind}.jsonl"
        (out / name).write_text(proc.stdout)
        return [name]

    return step


STEPS = (
    ("nvidia-smi -q -x", step_smi),
    ("host probe (checks/verify_host.py)", step_host),
    ("torch probe --level full (checks/verify_torch.py)", step_torch),
    *((f"sampler under the {kind} load ({what})", step_sampler(kind)) for kind, what in LOADS),
)


# ---- the figures: a pure function of the files -------------------------------------------------


def _mean(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return sum(values) / len(values) if values else None


def _cell(value, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def throughput_rows(doc: dict) -> list[str]:
    """One table row per speed record: measured, the probe's datasheet peak, the fraction, the verdict."""
    rows = []
    for r in doc.get("records", []):
        if r.get("id") not in ("matmul.bf16", "matmul.tf32", "membw", "pcie.h2d", "pcie.d2h", "nccl.allreduce", "training"):
            continue
        measured, peak = r.get("measured"), r.get("expected")
        numeric = isinstance(measured, (int, float)) and isinstance(peak, (int, float)) and peak
        fraction = f"{measured / peak:.0%}" if numeric else "-"
        shown = f"{measured:g}" if isinstance(measured, (int, float)) else "-"
        rows.append(f"| {r['id']} | {shown} | {r.get('unit') or ''} | {peak if peak is not None else '-'} | {fraction} | {r.get('status')} |")
    return rows


def load_row(kind: str, lines: list[str]) -> str:
    """GPU 0 under one load: the sampler's readings averaged (its first sample has no GPM interval yet, so it is left out)."""
    samples = [rec for rec in map(json.loads, (ln for ln in lines if ln.startswith("{"))) if rec.get("type") == "sample" and rec.get("gpus")][1:]
    gpu0 = [rec["gpus"][0] for rec in samples]
    util, sm, occ = (_mean(g.get(k) for g in gpu0) for k in ("util_gpu", "sm_active", "sm_occupancy"))
    clock, power = _mean(g.get("sm_clock_mhz") for g in gpu0), _mean(g.get("power_w") for g in gpu0)
    what = dict(LOADS)[kind]
    return (f"| {kind} ({what}) | {len(gpu0)} | {_cell(util, '.0f')} % | {_cell(sm and sm * 100, '.0f')} % | "
            f"{_cell(occ and occ * 100, '.0f')} % | {_cell(clock, '.0f')} | {_cell(power, '.0f')} |")


def figures_markdown(out: Path) -> str:
    """figures.md for a capture folder, from its files alone (the replay tests recompute it and compare)."""
    manifest = json.loads((out / MANIFEST).read_text())
    lines = [f"## {manifest['name']}: {manifest.get('gpu') or 'unknown GPU'}, driver {manifest.get('driver') or '?'}, "
             f"torch {manifest.get('torch') or '?'}", ""]
    torch_doc = out / "verify-torch-full.json"
    if torch_doc.is_file():
        lines += ["Speed against the datasheet peak (checks/verify_torch.py GPU_PEAKS; pass at >= 70 %):", "",
                  "| record | measured | unit | peak | of peak | verdict |", "|---|---|---|---|---|---|",
                  *throughput_rows(json.loads(torch_doc.read_text())), ""]
    loads = [(kind, out / f"sampler-{kind}.jsonl") for kind, _ in LOADS]
    if any(path.is_file() for _, path in loads):
        lines += [f"What NVML reads on GPU 0 under each load (checks/gpu_sampler.py every {SAMPLE_INTERVAL_S:g} s; "
                  "utilisation: time a kernel ran; SM activity: share of SMs busy):", "",
                  "| load | samples | utilisation | SM activity | SM occupancy | SM clock MHz | power W |", "|---|---|---|---|---|---|---|",
                  *(load_row(kind, path.read_text().splitlines()) for kind, path in loads if path.is_file()), ""]
    skipped = [f"- {s['step']}: {s['why']}" for s in manifest["steps"] if s["status"] != "ok"]
    if skipped:
        lines += ["Not captured:", "", *skipped, ""]
    return "\n".join(lines)


# ---- the run -----------------------------------------------------------------------------------


def machine_name(gpu: str | None, driver: str | None) -> str:
    """A fixture folder name: the GPU model and the driver's major version, e.g. nvidia-h200-driver570."""
    base = re.sub(r"[^a-z0-9]+", "-", (gpu or "no-gpu").lower()).strip("-")
    return f"{base}-driver{driver.split('.')[0]}" if driver else base


def capture(out: Path, name: str | None = None) -> dict:
    """Run every step into ``out``; the manifest says what ran, what was skipped and why."""
    machine = Machine()
    gpu = machine.torch.cuda.get_device_name(0) if machine.torch is not None else None
    steps = []
    for title, step in STEPS:
        try:
            steps.append({"step": title, "status": "ok", "why": "", "files": step(machine, out)})
        except Skip as why:
            steps.append({"step": title, "status": "skipped", "why": str(why), "files": []})
        except Failed as why:
            steps.append({"step": title, "status": "failed", "why": str(why), "files": []})
    torch = machine.torch or sys.modules.get("torch")
    manifest = {
        "name": name or machine_name(gpu, machine.driver),
        "captured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gpu": gpu, "driver": machine.driver, "torch": getattr(torch, "__version__", None),
        "python": sys.version.split()[0], "steps": steps,
    }  # fmt: skip
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    if any(s["status"] == "ok" for s in steps):
        (out / FIGURES).write_text(figures_markdown(out))
    return manifest


def report(manifest: dict, out: Path) -> str:
    lines = [f"gpu_capture: {manifest['name']} into {out}"]
    for s in manifest["steps"]:
        lines.append(f"  {s['status']:<8} {s['step']}" + (f": {s['why']}" if s["why"] else f" -> {', '.join(s['files'])}"))
    skipped = [s["step"] for s in manifest["steps"] if s["status"] == "skipped"]
    failed = [s["step"] for s in manifest["steps"] if s["status"] == "failed"]
    if skipped:
        lines.append(f"skipped {len(skipped)} of {len(manifest['steps'])} steps" + ("; nothing captured" if len(skipped) == len(manifest["steps"]) else ""))
    if failed:
        lines.append(f"failed {len(failed)}: {'; '.join(failed)}")
    if not skipped and not failed:
        lines.append(f"captured everything; copy {out} to tests/fixtures/gpu/{manifest['name']}/ and {FIGURES} into bench/README.md")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_capture.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or None, help="folder to write into (default: $OUT)")
    parser.add_argument("--name", help="the fixture's name (default: GPU model and driver major, e.g. nvidia-h200-driver570)")
    args = parser.parse_args(argv)
    if not args.out:
        parser.error("give --out DIR (or set $OUT)")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out} exists and is not a folder")
    if out.is_dir() and (out / MANIFEST).exists():
        parser.error(f"--out {out} already holds a capture ({MANIFEST}); give an empty or new folder")
    out.mkdir(parents=True, exist_ok=True)
    manifest = capture(out, args.name)
    sys.stdout.write(report(manifest, out))
    return 1 if any(s["status"] == "failed" for s in manifest["steps"]) else 0


if __name__ == "__main__":
    sys.exit(main())

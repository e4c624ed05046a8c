#!/usr/bin/env python3
"""Build figures: warm rebuild after a checks/ edit, image size against its content, what jupyter adds
on a host with slim, gpurig's slim beside a naive Dockerfile.

    python bench/bench_build.py [--cuda cpu|13.0] [--runs 3] [--keep]

Prints figures; it is not a timed test. Needs a Docker engine with BuildKit, hadolint, and
(for --cuda cpu, the default) the CPU torch wheel in pip's find-links directory. Images it
builds carry the label io.gpurig.bench and are removed at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpurig.connect.engineopen import local_engine  # noqa: E402
from gpurig.deploy.progress import human_size  # noqa: E402
from gpurig.image.build import resolve_ca_bundle  # noqa: E402
from gpurig.image.dockercli import find_client  # noqa: E402

LABEL = "io.gpurig.bench"
# The bench's own base name (bootstrapped, labelled, removed at the end): other users of the engine may
# retag or remove debian:bookworm-slim while it runs.
BASE = "gpurig-bench-base:bookworm"
CPU_TORCH, CUDA_TORCH = "2.13.0", "2.14.1"

SPEC = """\
name: gpurig-bench
python: "3.11"
matrix:
  - {{torch: "{cpu}", cuda: "cpu", default: true}}
  - {{torch: "{cuda_torch}", cuda: "13.0"}}
base:
  image: {base}
  bootstrap: {{suite: bookworm, mirror: "http://deb.debian.org/debian"}}
build:
  find_links: [{wheels}]
  torch_index: ""
  aliases: []
"""

# What a hand-written Dockerfile often looks like: one stage, no cache mounts, the
# wheelhouse copied in, pip's cache and apt's lists left in the layers.
NAIVE = """\
FROM {base}
RUN apt-get update && apt-get install -y python3 python3-venv python3-pip ca-certificates tini
RUN python3 -m venv /opt/venv
COPY wheelhouse /wheelhouse
RUN --mount=type=secret,id=ca,target=/run/secrets/ca.pem \\
    PIP_CERT=/run/secrets/ca.pem /opt/venv/bin/pip install --find-links /wheelhouse {requirement}
"""


def wheel_dir() -> str:
    folders = os.environ.get("PIP_FIND_LINKS", "").split()
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            folders += value.strip().strip("'\"").split()
    return next((f for f in folders if Path(f).is_dir()), "")


def gpurig(project: Path, *args: str) -> subprocess.CompletedProcess:
    code = "import sys; from gpurig.cli import main; main(['gpurig', *sys.argv[1:]])"
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=project, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"gpurig {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr}")
    return proc


def docker(client: str, *args: str) -> str:
    proc = subprocess.run([client, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"docker {' '.join(args[:3])} failed: {proc.stderr.strip()}")
    return proc.stdout


def layer_bytes(client: str, ref: str, needle: str) -> int:
    out = docker(client, "history", "--no-trunc", "--human=false", "--format", "{{.Size}}\t{{.CreatedBy}}", ref)
    return sum(int(size) for size, _, created in (line.partition("\t") for line in out.splitlines()) if needle in created)


def rootfs(engine, ref: str) -> list[str]:
    return list(engine.image(ref).layers)


def image_bytes(client: str, ref: str) -> int:
    return int(json.loads(docker(client, "image", "inspect", ref))[0]["Size"])


def content_bytes(client: str, ref: str, base: str) -> dict[str, int]:
    """What the image must contain: the base, the Python runtime apt installed, the venv with torch and its libraries."""
    venv = docker(client, "run", "--rm", "--network", "none", "--label", f"{LABEL}=1", "--entrypoint", "du",
                  ref, "-sb", "/opt/venv")
    return {
        "base": image_bytes(client, base),
        "python (apt layer)": layer_bytes(client, ref, "apt-get install"),
        "venv (torch + libraries)": int(venv.split()[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", default="cpu", help="cpu (local wheel, fast) or 13.0 (torch from the index)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the images built here")
    args = parser.parse_args()
    docker_client = find_client()
    client = docker_client.path
    wheels = wheel_dir()
    if args.cuda == "cpu" and not wheels:
        sys.exit("no find-links directory with the CPU torch wheel (pip config list / PIP_FIND_LINKS)")
    torch = CPU_TORCH if args.cuda == "cpu" else CUDA_TORCH
    tag = f"{torch}-{'cpu' if args.cuda == 'cpu' else 'cu' + args.cuda.replace('.', '')}-slim"
    ref = f"gpurig-bench:{tag}"
    work = Path(tempfile.mkdtemp(prefix="gpurig-bench-"))
    try:
        project = work / "project"
        (project / "images").mkdir(parents=True)
        for name in ("templates", ".hadolint.yaml"):
            (project / name).symlink_to(REPO / name)
        shutil.copytree(REPO / "checks", project / "checks", ignore=shutil.ignore_patterns("__pycache__"))
        (project / "images" / "pytorch.yaml").write_text(SPEC.format(base=BASE, cpu=CPU_TORCH, cuda_torch=CUDA_TORCH, wheels=wheels or "[]"))
        build = ("build", "--variant", "slim", "--cuda", args.cuda, "--label", f"{LABEL}=1")
        report_file = project / "reports/builds/gpurig-bench" / f"{tag}.json"

        print(f"== gpurig slim ({ref}), first build (cold or from BuildKit's cache)")
        started = time.monotonic()
        gpurig(project, *build)
        first = json.loads(report_file.read_text())
        print(f"   {time.monotonic() - started:.1f} s wall, build {first['duration_s']} s, "
              f"{first['steps']['ran']} of {first['steps']['total']} steps ran")

        print(f"== warm rebuild after editing checks/verify_torch.py, {args.runs} runs")
        walls, builds = [], []
        for run in range(args.runs):
            with open(project / "checks" / "verify_torch.py", "a") as fh:
                fh.write(f"# bench edit {run} {time.time()}\n")
            started = time.monotonic()
            gpurig(project, *build)
            walls.append(time.monotonic() - started)
            report = json.loads(report_file.read_text())
            builds.append(report["duration_s"])
            print(f"   run {run + 1}: {walls[-1]:.1f} s wall (render, lint, build, freeze), build {builds[-1]:.1f} s, "
                  f"{report['steps']['ran']} of {report['steps']['total']} steps ran")
        print(f"   median: {statistics.median(walls):.1f} s wall, {statistics.median(builds):.1f} s build (target < 15 s)")

        print("== size against content")
        parts = content_bytes(client, ref, BASE)
        need, size = sum(parts.values()), image_bytes(client, ref)
        for name, value in parts.items():
            print(f"   {name:26} {human_size(value):>10}")
        print(f"   {'sum':26} {human_size(need):>10}")
        print(f"   {'gpurig slim image':26} {human_size(size):>10}  = {size / need:.3f} x the sum (target <= 1.10)")

        print("== jupyter on a host that has slim (the layers they share are stored once)")
        jupyter = ref.replace("-slim", "-jupyter")
        started = time.monotonic()
        gpurig(project, "build", "--variant", "jupyter", "--cuda", args.cuda, "--label", f"{LABEL}=1")
        print(f"   jupyter built in {time.monotonic() - started:.1f} s wall")
        with local_engine() as engine:
            sizes = engine.layer_sizes(ref, jupyter)
            slim_layers, jupyter_layers = rootfs(engine, ref), rootfs(engine, jupyter)
        shared = [layer for layer in jupyter_layers if layer in slim_layers]
        torch_layer = max(slim_layers, key=sizes.__getitem__)
        extra = sum(sizes[layer] for layer in set(jupyter_layers) - set(slim_layers))
        print(f"   slim's torch layer ({human_size(sizes[torch_layer])}) in jupyter: {torch_layer in jupyter_layers}; "
              f"{len(shared)} of jupyter's {len(jupyter_layers)} layers are slim's")
        print(f"   jupyter needs {human_size(extra)} more than slim (uncompressed layer tars; target < 300 MB)")

        print("== the same content from a naive single-stage Dockerfile")
        naive = work / "naive"
        (naive / "wheelhouse").mkdir(parents=True)
        if args.cuda == "cpu":
            for wheel in Path(wheels).glob(f"torch-{CPU_TORCH}+cpu-*.whl"):
                shutil.copy2(wheel, naive / "wheelhouse" / wheel.name)
        requirement = f"torch=={torch}+cpu" if args.cuda == "cpu" else f"torch=={torch}"
        (naive / "Dockerfile").write_text(NAIVE.format(base=BASE, requirement=requirement))
        argv = [client, "build", "--progress=plain", "--label", f"{LABEL}=1", "-t", f"gpurig-bench-naive:{tag}"]
        ca = resolve_ca_bundle("auto")
        if ca:
            argv += ["--secret", f"id=ca,src={ca}"]
        started = time.monotonic()
        proc = subprocess.run([*argv, str(naive)], capture_output=True, text=True, env={**os.environ, "DOCKER_BUILDKIT": "1"})
        if proc.returncode != 0:
            sys.exit(f"naive build failed:\n{proc.stdout[-2000:]}")
        naive_size = image_bytes(client, f"gpurig-bench-naive:{tag}")
        print(f"   built in {time.monotonic() - started:.1f} s")
        print(f"   {'naive image':26} {human_size(naive_size):>10}  = {naive_size / need:.3f} x the sum")
        print(f"   {'gpurig slim image':26} {human_size(size):>10}  ({(naive_size - size) / naive_size:.0%} smaller)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep:
            ids = docker(client, "image", "ls", "-q", "--filter", f"label={LABEL}=1").split()
            if ids:
                subprocess.run([client, "image", "rm", "-f", *sorted(set(ids))], capture_output=True)


if __name__ == "__main__":
    main()

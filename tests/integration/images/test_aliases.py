"""Aliases that several matrix entries make stay on the default entry's image, and a move between entries is said."""

from __future__ import annotations

import json

from conftest import BASE, CPU_TORCH, CUDA, CUDA_TORCH, SESSION, SPEC_NAME, TEST_LABEL, docker

NAME = f"{SPEC_NAME}-al"
CUDA_SLIM = f"{CUDA_TORCH}-cu{CUDA.replace('.', '')}-slim"
CPU_SLIM = f"{CPU_TORCH}-cpu-slim"


def spec_with(project, default: str):
    """The session's spec under another name, aliases ["{variant}"], and ``default`` ('cpu' or 'cuda') as the default entry."""
    text = (project / "images" / "pytorch.yaml").read_text()
    text = text.replace(f"name: {SPEC_NAME}", f"name: {NAME}").replace('aliases: ["{variant}-{cuda_tag}"]', 'aliases: ["{variant}"]')
    if default == "cuda":
        text = text.replace('cuda: "cpu", default: true}', 'cuda: "cpu"}').replace(f'cuda: "{CUDA}"}}', f'cuda: "{CUDA}", default: true}}')
    # beside images/, not in it: the session's other tests read every spec in images/ (render --all, images, lint)
    path = project / f"aliases-{default}.yaml"
    path.write_text(text)
    return path


def image_id(ref: str) -> str:
    return json.loads(docker("image", "inspect", ref).stdout)[0]["Id"]


def build_cpu_slim(cli, spec):
    proc = cli("build", "--spec", str(spec), "--variant", "slim", "--cuda", "cpu", "--label", f"{TEST_LABEL}={SESSION}")
    assert proc.returncode == 0, f"gpurig build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    return proc, json.loads((cli.project / "reports" / "builds" / NAME / f"{CPU_SLIM}.json").read_text())


def test_building_the_cpu_slim_leaves_the_shared_alias_on_the_default_cuda_image_and_says_so(cli, base):
    # stands in for the CUDA slim (a 3 GB build): an image with the labels gpurig gives it, tagged as {variant} was
    cid = docker("create", "--label", f"{TEST_LABEL}={SESSION}", BASE, "true").stdout.strip()
    try:
        labels = {"io.gpurig.torch": CUDA_TORCH, "io.gpurig.cuda": CUDA, "io.gpurig.variant": "slim", TEST_LABEL: SESSION}
        changes = [arg for k, v in labels.items() for arg in ("--change", f"LABEL {k}={v}")]
        docker("commit", *changes, cid, f"{NAME}:slim")
    finally:
        docker("rm", "-f", cid, check=False)
    cuda_slim = image_id(f"{NAME}:slim")
    # the seen case: CUDA is the default entry; the CPU slim is built and must not take pytorch:slim
    said, report = build_cpu_slim(cli, spec_with(cli.project, "cuda"))
    assert image_id(f"{NAME}:slim") == cuda_slim
    left = f"{NAME}:slim stays on {CUDA_SLIM}: the alias {{variant}} is made by several matrix entries and follows the default one"
    assert left in said.stdout and report["aliases"] == [] and report["alias_notes"][0].startswith(left)
    # the CPU entry made the default: its build owns the alias now, and moving it is said
    said, report = build_cpu_slim(cli, spec_with(cli.project, "cpu"))
    assert image_id(f"{NAME}:slim") == image_id(f"{NAME}:{CPU_SLIM}")
    moved = f"moved {NAME}:slim from {CUDA_SLIM} to {CPU_SLIM}"
    assert moved in said.stdout and report["alias_notes"] == [moved]

"""slim (CPU torch for speed): it builds from the local base, runs torch as the user, reports, rebuilds from cache."""

from __future__ import annotations

import json
import os

from conftest import CPU_TORCH, SESSION, SPEC_NAME, TEST_LABEL, docker, probe_records, run_in


def test_base_path_is_stated(base):
    found, said = base
    assert found.source in ("local", "pulled", "bootstrapped")
    assert said and found.ref in said[-1]
    if found.stand_in:
        assert "stand-in" in said[-1] and "debootstrap --variant=minbase bookworm" in said[-1]


def test_slim_builds_and_runs_torch_as_the_user(build):
    image = build("slim")
    proc = run_in(
        image.ref, "python", "-c", "import os, torch; print(os.getuid(), torch.__version__, torch.ones(2).numpy().sum())"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1000", f"{CPU_TORCH}+cpu", "2.0"]
    assert "NumPy" not in proc.stderr  # torch warns "Failed to initialize NumPy" without it


def test_report_pins_what_was_built(build, docker_client):
    report = build("slim").report
    inspected = json.loads(docker("image", "inspect", report["image"]).stdout)[0]
    assert report["image_id"] == inspected["Id"]
    assert report["size_bytes"] == inspected["Size"] and report["layers"] == len(inspected["RootFS"]["Layers"])
    assert report["aliases"] == [f"{SPEC_NAME}:slim-cpu"] and f"{SPEC_NAME}:slim-cpu" in inspected["RepoTags"]
    assert f"torch=={CPU_TORCH}+cpu" in report["pip_freeze"] and report["torch_resolved"] == f"torch=={CPU_TORCH}+cpu"
    assert report["dpkg"]["python3"].startswith("3.11") and "tini" in report["dpkg"]
    assert report["base"]["id"].startswith("sha256:") and report["base"]["source"] in ("local", "pulled", "bootstrapped")
    assert report["settings"]["ca_bundle"] in ("passed as build secret", "none")
    assert report["duration_s"] > 0 and report["steps"]["total"] >= 8
    labels = inspected["Config"]["Labels"]
    assert labels["io.gpurig.torch"] == CPU_TORCH and labels["io.gpurig.image.baseimage.source"] == report["base"]["origin"]
    assert report["steps"]["total"] == report["steps"]["cached"] + report["steps"]["ran"]


def test_the_images_probe_reports_the_missing_gpu_as_json(build):
    proc = run_in(build("slim").ref, "python", "/opt/gpurig/checks/verify_torch.py", "--json")
    assert "Traceback" not in proc.stderr and len(proc.stdout.strip().splitlines()) == 1  # one JSON document only
    records = probe_records(proc.stdout)
    assert records["torch.cuda_version"]["status"] == "pass" and records["torch.cuda_version"]["expected"] == "cpu"  # the image's ENV
    assert records["cuda.available"]["status"] == "fail" and "CPU-only torch" in records["cuda.available"]["detail"]


def test_rebuild_without_change_is_a_full_cache_hit(build, cli):
    first = build("slim")
    proc = cli("build", "--variant", "slim", "--cuda", "cpu", "--label", f"{TEST_LABEL}={SESSION}")
    assert proc.returncode == 0, proc.stderr
    again = json.loads((cli.project / "reports/builds" / SPEC_NAME / f"{CPU_TORCH}-cpu-slim.json").read_text())
    assert again["steps"]["ran"] == 0, proc.stdout
    assert again["image_id"] == first.report["image_id"]
    assert again["pip_freeze"] == first.report["pip_freeze"]
    assert "(full cache hit)" in proc.stdout


def test_images_lists_this_projects_images_only(build, cli, base, tmp_path):
    """Not another project's image on the same engine, not a dangling one an earlier build left."""
    slim = build("slim")
    base_ref = base[0].ref

    def tiny(tag: str, project: str, marker: str) -> str:
        context = tmp_path / marker
        context.mkdir()
        (context / "Dockerfile").write_text(
            f"FROM {base_ref}\nLABEL io.gpurig.project={project} io.gpurig.variant=slim gpurig.marker={marker}\n")
        docker("build", "-q", "--label", f"{TEST_LABEL}={SESSION}", "-t", tag, str(context), env=dict(os.environ, DOCKER_BUILDKIT="1"))
        return json.loads(docker("image", "inspect", tag).stdout)[0]["Id"]

    other = tiny(f"{SPEC_NAME}-other:x", f"{SPEC_NAME}-other", "other")
    dangling = tiny(f"{SPEC_NAME}:dangler", SPEC_NAME, "first")
    tiny(f"{SPEC_NAME}:dangler", SPEC_NAME, "second")  # takes the tag: the first one is dangling now
    table = cli("images")  # piped, a table all the same, like every other task's (seen: TSV whenever not a terminal)
    assert table.returncode == 0 and "\t" not in table.stdout and table.stdout.split()[:4] == ["images", "of", SPEC_NAME, "image"]
    proc = cli("images", "--format", "tsv")
    assert proc.returncode == 0, proc.stderr
    header, *rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert header == ["image", "variant", "torch", "CUDA", "size", "created", "base"]
    images = {row[0]: row for row in rows}
    assert f"{SPEC_NAME}:{CPU_TORCH}-cpu-slim {SPEC_NAME}:slim-cpu" in images
    row = images[f"{SPEC_NAME}:{CPU_TORCH}-cpu-slim {SPEC_NAME}:slim-cpu"]
    assert row[1:4] == ["slim", CPU_TORCH, "cpu"]  # torch as the matrix names it, the build in the CUDA column
    origin = {"bootstrapped": "bootstrapped stand-in"}.get(slim.report["base"]["origin"], slim.report["base"]["origin"])
    assert row[6] == f"{base_ref} ({origin})"
    assert not any("-other" in name for name in images) and other[7:19] not in proc.stdout
    assert len(rows) == len(images) and all(images) and dangling[7:19] not in proc.stdout  # no untagged row

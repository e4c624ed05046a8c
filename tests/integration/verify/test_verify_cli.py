"""`gpurig verify` over real SSH on a host with a real Docker engine, against a CPU torch image built by gpurig.

No GPU exists here, so the verdict is the CPU one: the container's GPU
records fail or skip with their concrete reason, torch, shm and the
DataLoader still run, and the exit status says the host is not ready.
"""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET

import pytest

from tests.integration.verify.conftest import REPO, gpurig

pytestmark = pytest.mark.integration
PROBE = REPO / "checks" / "verify_torch.py"


def records(doc: dict, host: str) -> dict[str, dict]:
    [entry] = [h for h in doc["hosts"] if h["host"] == host]
    return {r["id"]: r for r in entry["data"]["records"]}


def verify_containers_of(docker_engine, image: str) -> list[str]:
    """This test's probe containers: by image, as another worker's verify (the fabric module's) shares the engine and label."""
    return docker_engine("ps", "-aq", "--filter", "label=io.gpurig.verify", "--filter", f"ancestor={image}").stdout.split()


def test_quick_verify_of_an_image_over_ssh(docker_host, torch_image, tmp_path, docker_engine):
    report, junit = tmp_path / "verify.json", tmp_path / "verify.xml"
    # the floor under a quick verify, measured now, under whatever load the machine has now: a container start and torch's import
    start = time.monotonic()
    docker_engine("run", "--rm", torch_image, "python3", "-c", "import torch")
    floor = time.monotonic() - start
    start = time.monotonic()
    proc = gpurig("verify", "-i", str(docker_host.inventory), "-l", docker_host.name, "--image", torch_image,
                  "--json", str(report), "--junit", str(junit), cwd=docker_host.project)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr  # no GPU: not ready, and said so
    # bench/README.md: the whole verify is that floor plus about a second (host probe, Docker facts, records); a ratio, not
    # a fixed wall-clock limit, so that load on the machine moves both sides
    assert elapsed < 2 * floor + 5, f"quick verify took {elapsed:.1f}s, the container start and torch import alone {floor:.1f}s"
    doc = json.loads(report.read_text())
    assert doc["schema"] == "gpurig.verify/1" and doc["level"] == "quick" and doc["passed"] is False
    got = records(doc, docker_host.name)
    assert got["torch.import"]["status"] == "pass" and got["torch.import"]["measured"].startswith("2.13.0")
    assert got["torch.cuda_version"]["status"] == "pass"  # the image's io.gpurig.cuda label (cpu) was passed on
    assert got["torch.cuda_version"]["expected"] == "cpu"
    assert got["cuda.available"]["status"] == "fail" and "CPU-only torch in the image" in got["cuda.available"]["detail"]
    assert got["shm.size"]["status"] == "pass"  # a throwaway run gets a 16g /dev/shm
    assert got["dataloader.workers"]["status"] == "pass"
    assert got["toolkit.runtime"]["status"] == "skip" and "no NVIDIA GPU" in got["toolkit.runtime"]["detail"]
    # the fleet row: the host, its worst status, the failing record and its fix
    first_failure = next(r["id"] for r in got.values() if r["status"] == "fail")  # the host probe's, where the host has one
    row = next(line for line in proc.stdout.splitlines() if line.startswith(docker_host.name))
    assert " fail " in row and f"{first_failure}:" in row
    root = ET.parse(junit).getroot()
    [suite] = root.findall("testsuite")
    assert suite.get("name") == docker_host.name and int(suite.get("tests")) == len(got)
    assert int(suite.get("failures")) == sum(1 for r in got.values() if r["status"] == "fail")
    assert not verify_containers_of(docker_engine, torch_image)  # the throwaway container went with --rm


def test_deployed_container_with_docker_default_shm(docker_host, workload):
    name = workload("--shm-size", "64m")
    proc = gpurig("verify", "-i", str(docker_host.inventory), "--container", name, "--json", "-", "-v", cwd=docker_host.project)
    assert proc.returncode == 1, proc.stderr
    got = records(json.loads(proc.stdout), docker_host.name)
    shm = got["shm.size"]
    assert shm["status"] == "fail" and shm["measured"] == 64
    assert "DataLoader workers" in shm["detail"] and "shm_size: 16g" in shm["fix"]
    # CUDA is missing for the image's reason first: a CPU-only torch
    assert "CPU-only torch" in got["cuda.available"]["detail"]


# What `nvidia-smi -L` prints on a two-GPU host (recorded on an A100 machine; UUIDs shortened to fake ones).
SMI_L = """GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5f2a9c1e-0b7d-4e21-9a3c-1d2e3f4a5b6c)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-8c3b0d2f-1e6a-4f32-8b4d-2e3f4a5b6c7d)
"""


def test_gpu_host_without_the_nvidia_runtime(docker_host, torch_image):
    """A host whose nvidia-smi lists GPUs but whose Docker has no nvidia runtime: the toolkit fault, with its fix."""
    docker_host.write("/usr/local/bin/nvidia-smi", f"#!/bin/sh\ncat <<'EOF'\n{SMI_L}EOF\n")
    proc = gpurig("verify", "-i", str(docker_host.inventory), "--image", torch_image, "--json", "-", cwd=docker_host.project)
    assert proc.returncode == 1, proc.stderr
    got = records(json.loads(proc.stdout), docker_host.name)
    runtime = got["toolkit.runtime"]
    assert runtime["status"] == "fail" and "nvidia runtime is missing" in runtime["detail"]
    assert "gpurig provision" in runtime["fix"]
    assert got["torch.import"]["status"] == "pass"  # the image still ran (without --gpus) and said what it could


def test_missing_container_is_one_clear_failure(docker_host):
    proc = gpurig("verify", "-i", str(docker_host.inventory), "--container", "no-such-box", "--json", "-", cwd=docker_host.project)
    assert proc.returncode == 1
    probe = records(json.loads(proc.stdout), docker_host.name)["container.probe"]
    assert probe["status"] == "fail" and probe["detail"].startswith("no container no-such-box on this host")
    assert "gpurig deploy" in probe["fix"]


def test_probe_in_a_container_started_without_gpus_and_64mb_shm(docker_engine, torch_image, container_kit):
    """The probe sent on stdin (python3 -) into a real container: Docker's 64 MB /dev/shm and no GPUs."""
    proc = docker_engine("run", "--rm", "-i", "--label", f"{container_kit.label}={container_kit.session}", "--shm-size", "64m",
                         "--entrypoint", "python3", torch_image, "-", "--json", "--level", "full", "--expect-cuda", "cpu",
                         input=PROBE.read_text(), check=False)
    assert proc.returncode == 1, proc.stderr
    got = {r["id"]: r for r in json.loads(proc.stdout)["records"]}
    assert got["shm.size"]["status"] == "fail" and "bus error" in got["shm.size"]["detail"]
    assert got["dataloader.workers"]["status"] == "pass"  # small batches still fit; the shm record warns before big ones do
    assert got["training"]["status"] == "skip"


def test_bad_flags_are_one_line_before_any_host(docker_host):
    proc = gpurig("verify", "-i", str(docker_host.inventory), "--container", "a", "--image", "b", cwd=docker_host.project)
    assert proc.returncode != 0 and "--container and --image both given" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_probe_past_its_timeout_leaves_no_container(docker_engine, torch_image):
    """The library call with a local connection: the throwaway container is removed by name when the probe overruns."""
    import dataclasses

    from gpurig.connect.local import LocalConnection
    from gpurig.verify.runner import VerifyPlan, verify_host

    plan = dataclasses.replace(VerifyPlan.from_checks("quick", image=torch_image), host_probe=None, container_timeout_s=0.5)
    verdict = verify_host(LocalConnection("here"), plan)
    probe = next(r for r in verdict.records if r.id == "container.probe")
    assert probe.status == "fail" and "did not finish within 0.5 s" in probe.detail
    assert not verify_containers_of(docker_engine, torch_image)


def test_hostile_names_are_refused_before_any_host_is_contacted(docker_host):
    hostile = "x$(touch /tmp/pwned);touch /tmp/pwned2 'q\"\n"
    proc = gpurig("verify", "-i", str(docker_host.inventory), "--container", hostile, "--json", "-", cwd=docker_host.project)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    [line] = proc.stderr.strip().splitlines()  # one line, the newline in the name shown as an escape
    assert "is not a container name" in line and "fix:" in line
    seen = docker_host.docker("exec", docker_host.cid, "sh", "-c", "ls /tmp/pwned /tmp/pwned2 2>&1 || true").stdout
    assert "No such file" in seen and seen.count("No such file") == 2

"""`gpurig deploy` then `gpurig verify` on the session's provisioned deploy host, over SSH, as a user runs them.

The host has stand-in GPUs (two A100s in nvidia-smi, the toolkit's hook and
the nvidia runtime) but no real one, and the image's torch is the CPU build
labelled as a CUDA 13 image: so the verdict is a known set of failures, each
with its reason and fix, and the toolkit records are really exercised.
"""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET

from .gpuhost import FAKE_GPUS
from .test_deploy import entries, gpu_image, run


def records(doc: dict) -> dict[str, dict]:
    [host] = doc["hosts"]
    return {r["id"]: r for r in host["data"]["records"]}


def test_verify_a_deployed_container(deploy_inventory, clean_deploy_host, gpurig_cli, cpu_images, docker_engine, tmp_path):
    image = gpu_image(cpu_images, docker_engine)
    inv = deploy_inventory(entries({"image": image, "variant": "slim", "user": "alice", "gpus": [1], "shm_size": "2g"}))
    run(gpurig_cli, cpu_images, inv, "deploy")
    start = time.monotonic()
    proc = run(gpurig_cli, cpu_images, inv, "verify", "--container", "gpurig-slim-alice",
               "--json", str(tmp_path / "v.json"), "--junit", str(tmp_path / "v.xml"), check_rc=1)
    elapsed = time.monotonic() - start
    got = records(json.loads((tmp_path / "v.json").read_text()))
    # the toolkit: deploy started the container with a GPU device request, on a host whose nvidia-smi lists GPUs
    assert got["toolkit.runtime"]["status"] == "pass" and "--gpus" in got["toolkit.runtime"]["detail"]
    # torch: the label says CUDA 13.0, the wheel is the CPU build; both said, with fixes
    assert got["torch.cuda_version"]["status"] == "fail" and got["torch.cuda_version"]["expected"] == "13.0"
    assert got["cuda.available"]["status"] == "fail" and "CPU-only torch" in got["cuda.available"]["detail"]
    assert got["toolkit.uuids"]["status"] == "skip"
    assert got["shm.size"]["status"] == "pass" and got["shm.size"]["measured"] == 2048  # what deploy configured
    assert got["dataloader.workers"]["status"] == "pass"
    assert elapsed < 10, f"quick verify of one deployed host took {elapsed:.1f}s"
    row = next(line for line in proc.stdout.splitlines() if line.startswith(clean_deploy_host.name))
    assert " fail " in row  # the fleet table's row for the host
    suite = ET.parse(tmp_path / "v.xml").getroot().find("testsuite")
    assert int(suite.get("tests")) == len(got) and int(suite.get("failures")) >= 2


def test_verify_an_image_asks_for_the_hosts_gpus(deploy_inventory, clean_deploy_host, gpurig_cli, cpu_images, docker_engine):
    image = gpu_image(cpu_images, docker_engine)
    inv = deploy_inventory(entries({"image": image, "variant": "slim"}))
    run(gpurig_cli, cpu_images, inv, "deploy")  # moves the image into the host's engine
    proc = run(gpurig_cli, cpu_images, inv, "verify", "--image", image, "--json", "-", check_rc=1)
    got = records(json.loads(proc.stdout))
    assert got["toolkit.runtime"]["status"] == "pass" and "--gpus all" in got["toolkit.runtime"]["detail"]
    assert got["torch.import"]["status"] == "pass"
    assert len(FAKE_GPUS) == 2  # the host's nvidia-smi lists two; the container saw none (CPU torch)
    assert got["toolkit.uuids"]["status"] == "skip"
    left = clean_deploy_host.docker("ps", "-aq", "--filter", "label=io.gpurig.verify").stdout.split()
    assert not left

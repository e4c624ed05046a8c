"""`gpurig build --lock`, then a build from the lock: the same wheels and Debian packages, installed again, exactly."""

from __future__ import annotations

import json
import re

from conftest import BASE, CPU_TORCH, SESSION, SPEC_NAME, TEST_LABEL, docker, run_in

# Run in each image: what a user compares to call two images the same.
VERSIONS = "pip freeze --all && echo '--- dpkg' && dpkg-query -W"


def test_a_build_from_the_lock_reinstalls_the_same_wheels_and_packages(cli, build, tmp_path):
    build("slim")  # the session's image: the --lock build below takes every layer but its labels from it
    name = f"{SPEC_NAME}-lock"
    spec = tmp_path / "lock.yaml"
    spec.write_text((cli.project / "images" / "pytorch.yaml").read_text().replace(f"name: {SPEC_NAME}", f"name: {name}"))
    argv = ("build", "--spec", str(spec), "--variant", "slim", "--cuda", "cpu", "--label", f"{TEST_LABEL}={SESSION}")
    report_file = cli.project / "reports" / "builds" / name / f"{CPU_TORCH}-cpu-slim.json"
    lock_file = tmp_path / "lock.yaml.lock"

    resolving = cli(*argv, "--lock")
    assert resolving.returncode == 0, f"gpurig build --lock failed:\n{resolving.stdout[-3000:]}\n{resolving.stderr[-2000:]}"
    # every layer came from the cache: nothing was resolved now, and the line says so (not "resolved afresh")
    assert f"not locked: the cached build's versions, lock written to {lock_file}" in resolving.stdout
    first = json.loads(report_file.read_text())
    assert first["locked"] is False and first["lock_file"] == str(lock_file)
    text = lock_file.read_text()
    assert re.search(rf"name: torch\n +version: {re.escape(CPU_TORCH)}\+cpu\n +sha256: [0-9a-f]{{64}}\n", text), text[:2000]
    assert "tini:" in text and "://" not in text

    locked = cli(*argv)
    assert locked.returncode == 0, f"gpurig build from the lock failed:\n{locked.stdout[-3000:]}\n{locked.stderr[-2000:]}"
    assert f"locked (from {lock_file})" in locked.stdout
    second = json.loads(report_file.read_text())
    assert second["locked"] is True and second["lock_file"] == str(lock_file)
    # really installed again (apt, venv, pip and what follows), not the unlocked build's layers: the two images share the base's
    # layers and nothing after (the locked steps ran now, or in an earlier run from the same lock: the kept base's cache)
    assert second["image_id"] != first["image_id"]
    layers = [json.loads(docker("image", "inspect", i).stdout)[0]["RootFS"]["Layers"] for i in (first["image_id"], second["image_id"])]
    shared = next((n for n, (a, b) in enumerate(zip(*layers)) if a != b), min(map(len, layers)))
    assert shared == len(json.loads(docker("image", "inspect", BASE).stdout)[0]["RootFS"]["Layers"]), second["steps"]
    dockerfile = re.sub(r"\\\n", " ", (cli.project / "build-contexts" / name / f"{CPU_TORCH}-cpu-slim" / "Dockerfile").read_text())
    assert "--require-hashes --no-deps -r /run/gpurig-lock/pip-torch.txt" in dockerfile and "tini=" in dockerfile

    versions = [run_in(image, "-c", VERSIONS, entrypoint="/bin/sh") for image in (first["image_id"], second["image_id"])]
    assert all(proc.returncode == 0 for proc in versions), [proc.stderr for proc in versions]
    assert versions[0].stdout == versions[1].stdout
    assert f"torch=={CPU_TORCH}+cpu" in versions[1].stdout and "\ntini\t" in versions[1].stdout

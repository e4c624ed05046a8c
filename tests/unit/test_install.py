"""A pip-installed gpurig (a real, non-editable wheel) starts a project with `gpurig init` and renders it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What a source checkout may hold that is not part of the source.
_NOT_SOURCE = (".git", "build", "dist", "*.egg-info", "__pycache__", "build-contexts", "reports", ".venv", ".pytest_cache", ".bench-venv")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Build from a copy so the checkout gets no build/ or egg-info; no build isolation: no download needed.
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*_NOT_SOURCE), symlinks=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src), "-w", str(work / "dist")],
        check=True, capture_output=True, text=True, timeout=300,
    )
    (found,) = (work / "dist").glob("gpurig-*.whl")
    return found


def test_the_wheel_carries_the_project_skeleton_once(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for path in ("images/pytorch.yaml", "templates/Dockerfile.j2", "templates/files/sshd_config.j2", "checks/verify_torch.py",
                 "inventory/hosts.yaml", ".hadolint.yaml", "tasks.py"):
        assert f"gpurig/skeleton/{path}" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith("known_hosts")]


def test_init_then_render_from_the_installed_wheel(wheel, tmp_path):
    venv = tmp_path / "venv"
    # system site-packages give the dependencies; the wheel itself goes into the venv
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("GPURIG_")}
    env["HOME"] = str(tmp_path)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300, env=env)
    where = subprocess.run([str(py), "-c", "import gpurig; print(gpurig.__file__)"], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(str(venv)), where.stdout  # the installed copy, not the checkout

    gpurig = str(venv / "bin" / "gpurig")
    init = subprocess.run([gpurig, "init", "proj"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert init.returncode == 0, init.stderr
    project = tmp_path / "proj"
    render = subprocess.run([gpurig, "render"], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert render.returncode == 0, render.stderr
    dockerfile = project / "build-contexts" / "pytorch" / "2.14.1-cu130-slim" / "Dockerfile"
    assert "FROM" in dockerfile.read_text()
    assert (dockerfile.parent / "checks" / "verify_torch.py").is_file()

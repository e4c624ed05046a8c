"""Bad input gets one line saying what to do, and a non-zero exit: no Docker, no daemon, no base, a failing step."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import SESSION, TEST_LABEL, write_spec


def one_line_error(proc) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpurig: ") and "; fix: " in lines[0]
    return lines[0]


def path_without_docker(tmp_path: Path) -> str:
    """A PATH with python, hadolint, git and the interpreter's neighbours, but no docker.

    The interpreter's own folder cannot simply be on it: for Debian's python3
    that is /usr/bin, where Debian's docker client lives too.
    """
    keep = tmp_path / "bin"
    keep.mkdir(exist_ok=True)
    for found in Path(sys.executable).parent.iterdir():
        if not found.name.startswith("docker") and not (keep / found.name).exists():
            (keep / found.name).symlink_to(found)
    for tool in ("hadolint", "git"):
        found_tool = shutil.which(tool)
        if found_tool and not (keep / tool).exists():
            (keep / tool).symlink_to(found_tool)
    assert shutil.which("docker", path=str(keep)) is None
    return str(keep)


def test_docker_missing(cli, tmp_path):
    env = {**cli.env, "PATH": path_without_docker(tmp_path)}
    env.pop("GPURIG_DOCKER", None)
    line = one_line_error(cli("build", "--variant", "slim", "--cuda", "cpu", env=env))
    assert "docker is not installed" in line


def test_no_buildkit_client(cli, tmp_path):
    """A docker client of 23.0 or later without the buildx plugin (this machine's /usr/local/bin/docker)."""
    candidates = [d for d in ("/usr/local/bin/docker",) if os.path.exists(d)]
    from gpurig.image.dockercli import probe_client, supports_buildkit

    lacking = [d for d in candidates if not supports_buildkit(probe_client(d).version, probe_client(d).buildx)]
    if not lacking:
        pytest.skip("no docker client without BuildKit on this machine")
    only = tmp_path / "only"
    only.mkdir()
    (only / "docker").symlink_to(lacking[0])
    env = {**cli.env, "PATH": f"{only}:{path_without_docker(tmp_path)}"}
    env.pop("GPURIG_DOCKER", None)
    line = one_line_error(cli("build", "--variant", "slim", "--cuda", "cpu", env=env))
    assert "can build with BuildKit" in line and "buildx" in line


def test_daemon_down(cli, tmp_path):
    env = {**cli.env, "DOCKER_HOST": f"unix://{tmp_path}/dead.sock"}
    line = one_line_error(cli("build", "--variant", "slim", "--cuda", "cpu", env=env))
    assert "does not answer" in line and "dead.sock" in line


def test_base_unavailable(cli, wheels):
    spec = write_spec(cli.project / "nobase.yaml", wheels, base="gpurig-test-absent/base:none", bootstrap=False)
    line = one_line_error(cli("build", "--spec", str(spec), "--variant", "slim", "--cuda", "cpu"))
    assert "base image gpurig-test-absent/base:none" in line and "could not be pulled" in line


def test_failing_run_step(cli, wheels, base):
    spec = write_spec(cli.project / "broken.yaml", wheels, slim="apt: [gpurig-no-such-package]")
    proc = cli("build", "--spec", str(spec), "--variant", "slim", "--cuda", "cpu", "--label", f"{TEST_LABEL}={SESSION}")
    line = one_line_error(proc)
    # a variant's own packages install after the shared torch layer, not at step 2 as before
    assert re.search(r"failed at step \d+/\d+", line) and "exit code 100" in line and "gpurig-no-such-package" in line

"""Killed mid-build: SIGTERM to `gpurig build` stops its `docker build` child and leaves no temporary folder behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import SESSION, SPEC_NAME, TEST_LABEL, wait_for, write_spec


def children(pid: int) -> dict[int, str]:
    """The processes whose parent is ``pid``, with their command lines (read from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found[int(entry.name)] = cmdline
    return found


def alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_stops_the_docker_build_and_removes_temp_folders(cli, base, wheels, tmp_path):
    # A user id of its own makes every step from `useradd` on miss the cache: the build is mid-step when killed.
    spec = write_spec(tmp_path / "killed.yaml", wheels)
    uid = 1001 + int(SESSION[:6], 16) % 60000
    spec.write_text(spec.read_text().replace(f"name: {SPEC_NAME}", f"name: {SPEC_NAME}-killed")
                    + f"user: {{name: gpurig, uid: {uid}}}\n")
    # Not under pytest's basetemp: a concurrent pytest session on this machine may prune it.
    scratch = Path(tempfile.mkdtemp(prefix="gpurig-test-tmpdir-"))
    code = "import sys; from gpurig.cli import main; main(['gpurig', *sys.argv[1:]])"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "build", "--spec", str(spec), "--variant", "slim", "--cuda", "cpu",
         "--label", f"{TEST_LABEL}={SESSION}"],
        cwd=cli.project, env={**cli.env, "TMPDIR": str(scratch)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )
    log = cli.project / "reports/builds" / f"{SPEC_NAME}-killed" / "2.13.0-cpu-slim.log"
    try:
        builds = wait_for("docker build started by gpurig", lambda: {
            pid: cmd for pid, cmd in children(proc.pid).items() if re.search(r"docker build ", cmd)
        } or (proc.poll() is not None and {"exited": proc.returncode}), 300, 0.05)
        assert "exited" not in builds, proc.communicate(timeout=60)
        wait_for("a RUN step under way", lambda: log.is_file() and re.search(r"^#\d+ \[.*\] RUN ", log.read_text(), re.M),
                 120, 0.1)
        assert proc.poll() is None, proc.communicate(timeout=60)
        assert "naming to" not in log.read_text(), "the build ended before the test could stop it"
        assert list(scratch.glob("gpurig-build-*")), "the build's scratch folder is where TMPDIR says"
        os.kill(proc.pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        left = sorted(p.name for p in scratch.iterdir())
        shutil.rmtree(scratch)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "Traceback" not in stderr and stderr.strip().splitlines() == [stderr.strip()]
    assert "terminated" in stderr
    for pid in builds:
        assert not alive(pid), f"docker build (pid {pid}) outlived gpurig"
    assert not [name for name in left if name.startswith("gpurig-build-")]
    assert [p.name for p in (cli.project / "build-contexts" / f"{SPEC_NAME}-killed").iterdir()] == ["2.13.0-cpu-slim"]

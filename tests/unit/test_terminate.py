"""SIGTERM reaches a task as an exception, like Ctrl-C: its cleanup runs, then one line and exit 143 (130 for Ctrl-C), fleet runs too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import running

SCRIPT = """
import signal, sys
from invoke import Context
from invoke.exceptions import Exit
from gpurig.cli.base import task

@task
def slow(c):
    try:
        print("ready", flush=True)
        signal.pause()
    finally:
        open(sys.argv[1], "w").write("cleaned up")

try:
    slow(Context())
except Exit as err:
    print(err.message, file=sys.stderr)
    sys.exit(err.code)
"""


def test_sigterm_runs_the_tasks_cleanup_and_exits_143(tmp_path: Path):
    marker = tmp_path / "marker"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(marker)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143 and stderr.strip() == "gpurig: terminated (SIGTERM)"
    assert marker.read_text() == "cleaned up"


def _started(path: Path, proc: subprocess.Popen) -> int:
    """The pid the command wrote once it started, polled for with a deadline."""
    end = time.monotonic() + 60
    while not (path.exists() and path.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()
        time.sleep(0.05)  # polling interval while waiting for the command to start, not a synchronisation sleep
    return int(path.read_text())


@pytest.mark.parametrize(("sig", "code", "said"), [(signal.SIGTERM, 143, "gpurig: terminated (SIGTERM)"),
                                                   (signal.SIGINT, 130, "gpurig: interrupted")])
def test_a_signal_stops_a_fleet_run_and_its_commands_with_the_signals_exit_code(tmp_path: Path, sig, code, said):
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  hosts:\n    here:\n      ansible_connection: local\n")
    started = tmp_path / "started"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "HOME": str(tmp_path)}
    line = f"echo $$ > {started}.tmp && mv {started}.tmp {started} && exec sleep 600"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from gpurig.cli import main; main(sys.argv)",
                             "exec", "-i", str(inventory), "--", line], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid = _started(started, proc)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, stderr
    assert stderr.strip().splitlines()[-1] == said
    assert "here: interrupted; the command was stopped" in stderr  # the host's line in the recap
    assert not running(pid)  # the command it ran was stopped, not left behind

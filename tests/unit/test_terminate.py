"""SIGTERM reaches a task as an exception, like Ctrl-C: its cleanup runs, then one line and exit 143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

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

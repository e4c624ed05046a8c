"""A monitored host that sent no sample was not watched: that host is failed, in one line, never counted ok.

Each way the sampler can be absent or silent, through a real LocalConnection
running a real shell line in the sampler's place.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpurig import skeleton
from gpurig.connect.local import LocalConnection
from gpurig.errors import GpurigError, HostError
from gpurig.monitor import MonitorError, agent
from gpurig.monitor.agent import agent_source, watch
from gpurig.monitor.session import Run

ROOT = Path(__file__).resolve().parents[2]
HELLO = json.dumps({"type": "hello", "hostname": "h", "source": "none"})
END = json.dumps({"type": "end", "samples": 0})


def sampler_printing(*lines: str, exit_code: int = 0) -> str:
    """A shell line standing in for the sampler: prints these lines, exits with this code."""
    return f"printf '%s\\n' {' '.join(shlex.quote(x) for x in lines)}; exit {exit_code}" if lines else f"exit {exit_code}"


def watch_line(command: str, stop: threading.Event | None = None) -> str:
    with pytest.raises(HostError) as caught:
        watch(LocalConnection("gpu-01"), Run(), 0.05, 0.2, command=command, stop=stop)
    err = caught.value
    assert err.host == "gpu-01" and "\n" not in str(err)
    return err.problem


def test_a_sampler_that_ended_without_a_sample():
    problem = watch_line(sampler_printing(HELLO, END))
    assert problem.startswith("no samples from this host in ") and "the sampler ended without sending one" in problem


def test_a_sampler_whose_samples_cannot_be_read():
    bad = json.dumps({"type": "sample", "t": "not a time", "gpus": "none"})
    problem = watch_line(sampler_printing(HELLO, bad, bad, END))
    assert "its 2 sample records could not be read" in problem


@pytest.mark.parametrize("lines", [(), ("Welcome!", "this is not json")])
def test_a_sampler_that_printed_nothing_or_garbage(lines):
    assert "the sampler stopped after 0 samples" in watch_line(sampler_printing(*lines))


def test_a_run_stopped_before_the_first_sample():
    stop = threading.Event()
    stop.set()
    assert "the run was stopped before its first sample" in watch_line(sampler_printing(HELLO, END), stop)


def test_a_host_with_samples_is_watched():
    sample = json.dumps({"type": "sample", "t": 1.0, "cpu": {"percent": 1.0, "per_core": [1.0]}, "mem": {"total": 2, "available": 1}, "gpus": []})
    summary = watch(LocalConnection("gpu-01"), Run(), 0.05, 0.2, command=sampler_printing(HELLO, sample, END))
    assert summary["samples"] == 1


def test_the_sampler_source_is_the_shipped_file():
    from gpurig.skeleton import shipped

    assert agent_source() == shipped("checks/gpu_sampler.py").read_text()
    assert shipped("checks/gpu_sampler.py").parent.name == "checks"


@pytest.mark.parametrize(("content", "said"), [(None, "cannot be read"), (b"\n", "is empty"), (b"\xff\xfe", "cannot be read")])
def test_an_unreadable_or_empty_sampler_is_one_error_before_any_host(tmp_path, monkeypatch, content, said):
    path = tmp_path / "gpu_sampler.py"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    monkeypatch.setattr(skeleton, "shipped", lambda name: path)
    with pytest.raises(MonitorError, match=said) as caught:
        agent.monitor_fleet([], None, Run(), 1.0, 1.0)  # type: ignore[arg-type]  # no host and no connector is ever reached
    assert "reinstall gpurig" in caught.value.fix


def test_a_sampler_missing_from_the_install_names_it(monkeypatch):
    def missing(name):
        raise GpurigError(f"this gpurig (/x) has no {name} (looked for /x/{name})", "reinstall")

    monkeypatch.setattr(skeleton, "shipped", missing)
    with pytest.raises(GpurigError, match="has no checks/gpu_sampler.py"):
        agent_source()


def test_the_monitor_task_fails_a_host_that_sent_no_sample(tmp_path):
    """The real CLI on this machine, whose python3 (found on PATH, as on a host) says hello and ends without sampling."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' {shlex.quote(HELLO)} {shlex.quote(END)}\n")
    fake.chmod(0o755)
    (tmp_path / "hosts.yaml").write_text("all:\n  hosts:\n    here:\n      ansible_connection: local\n")
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "COLUMNS": "250"}
    proc = subprocess.run([sys.executable, "-c", "from gpurig.cli import main; main()", "monitor", "-i", "hosts.yaml", "--duration", "0.3",
                           "--interval", "0.1", "--json", "out.json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    failed = [line for line in proc.stderr.splitlines() if line.startswith("failed")]
    assert len(failed) == 1 and "here: no samples from this host" in failed[0] and "the sampler ended without sending one" in failed[0]
    assert json.loads((tmp_path / "out.json").read_text())["fleet"]["summary"]["failed"] == 1

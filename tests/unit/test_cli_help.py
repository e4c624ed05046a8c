"""Every task's --help prints its help and does nothing else; -v/-vv are counted flags, documented as such.

Invoke's parser hands ``--help`` to a positional argument still waiting for
its value, so ``gpurig logs --help`` once contacted every host with a container
named ``--help`` and ``gpurig init --help`` made a project in ``./--help``.
The inventory here names a host whose address is a TCP listener this test
owns: any connection a help run attempted would be waiting in its backlog.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from invoke import Program

from gpurig.cli import build_collection, main

TASKS = sorted(build_collection().task_names)
CODE = "import sys; from gpurig.cli import main; main(sys.argv)"


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    yield sock
    sock.close()


@pytest.fixture
def project(tmp_path, listener, monkeypatch) -> Path:
    """A project whose only host is the listener, as the working directory."""
    (tmp_path / "gpurig.yaml").write_text("connect_timeout: 2\n")
    (tmp_path / "inventory").mkdir()
    port = listener.getsockname()[1]
    (tmp_path / "inventory" / "hosts.yaml").write_text(f"all: {{hosts: {{h1: {{ansible_host: 127.0.0.1, ansible_port: {port}}}}}}}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GPURIG_ROOT", str(tmp_path))
    return tmp_path


def gpurig(*args: str) -> None:
    """`gpurig ARGS` in this process; a help run may end in SystemExit, always with 0."""
    try:
        main(["gpurig", *args])
    except SystemExit as stop:
        assert stop.code in (0, None), stop.code


def assert_no_connection(listener) -> None:
    with pytest.raises(BlockingIOError):
        listener.accept()


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("word", ["--help", "-h"])
def test_task_help_prints_usage_and_touches_nothing(project, listener, capsys, task, word):
    before = sorted(p.name for p in project.iterdir())
    gpurig(task, word)
    out = capsys.readouterr().out
    assert f"[--core-opts] {task} " in out and "Docstring:" in out and "Options:" in out, out
    assert_no_connection(listener)
    assert sorted(p.name for p in project.iterdir()) == before  # init --help made no ./--help project


@pytest.mark.parametrize("task", ["logs", "init", "exec", "facts"])
def test_invoke_task_help_is_the_same(project, listener, capsys, task):
    # `invoke TASK --help` runs Invoke's own Program over tasks.py's collection: the same help, nothing touched
    try:
        Program(namespace=build_collection()).run(["invoke", task, "--help"])
    except SystemExit as stop:
        assert stop.code in (0, None), stop.code
    out = capsys.readouterr().out
    assert f"{task} [--options]" in out and "Options:" in out, out
    assert_no_connection(listener)
    assert not (project / "--help").exists()


def test_help_after_other_flags_is_still_help(project, listener, capsys):
    gpurig("logs", "-l", "h1", "--follow", "--help")
    assert "Usage:" in capsys.readouterr().out
    assert_no_connection(listener)


@pytest.mark.parametrize("task", [t for t in TASKS if t != "init"])
def test_verbose_is_documented_as_a_counted_flag(capsys, task):
    gpurig(task, "--help")
    out = capsys.readouterr().out
    if "--verbose" in out:
        assert "-v, --verbose " in out and "--verbose=INT" not in out and "-v INT" not in out, out


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPURIG_")}
    env["HOME"] = str(cwd)
    return subprocess.run([sys.executable, "-c", CODE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_v_counts_and_a_number_after_it_is_refused(tmp_path):
    # A peer that is not an SSH server: -vv shows paramiko's debug lines about it, -v and none do not.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve():
        while True:
            try:
                peer, _ = server.accept()
            except OSError:
                return
            with peer:
                peer.sendall(b"not ssh\r\n")

    threading.Thread(target=serve, daemon=True).start()
    try:
        (tmp_path / "inv.yaml").write_text(f"all: {{hosts: {{g1: {{ansible_host: 127.0.0.1, ansible_port: {server.getsockname()[1]}}}}}}}\n")
        base = ("exec", "-i", "inv.yaml", "--", "true")
        quiet, once = run(tmp_path, *base), run(tmp_path, "exec", "-v", *base[1:])
        for twice in (run(tmp_path, "exec", "-vv", *base[1:]), run(tmp_path, "exec", "--verbose", "--verbose", *base[1:])):
            assert twice.returncode == 1 and "paramiko.transport: debug:" in twice.stderr, twice.stderr
        for proc in (quiet, once):
            assert proc.returncode == 1 and "paramiko" not in proc.stderr and "unreachable g1" in proc.stderr, proc.stderr
        for args in (("-v", "2"), ("--verbose=2",)):
            refused = run(tmp_path, "exec", *args, *base[1:])
            assert refused.returncode != 0 and "'2'" in refused.stderr and "g1" not in refused.stderr, refused.stderr
    finally:
        server.close()

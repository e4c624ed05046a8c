"""gpurig.process.stop against real children: each ends, is reaped, and leaves nothing of its group running."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import pytest

from gpurig.process import stop

BOUND_S = 20  # no test here waits longer than this for anything


def spawn(script: str, *, session: bool = False, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """A Python child that prints 'ready' once its signal handlers are set; returned after that line."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            start_new_session=session, pass_fds=pass_fds)
    ready, _, _ = select.select([proc.stdout], [], [], BOUND_S)
    assert ready and proc.stdout.readline().strip() == "ready"
    return proc


def closed_within(fd: int, seconds: float) -> bool:
    """Whether every holder of the pipe's write end has gone (EOF on ``fd``) within ``seconds``."""
    ready, _, _ = select.select([fd], [], [], seconds)
    return bool(ready) and os.read(fd, 1) == b""


def test_a_child_that_obeys_sigterm_ends_with_it_and_is_reaped():
    proc = spawn("import time; print('ready', flush=True); time.sleep(600)")
    assert stop(proc) == -15
    assert proc.stdout.closed
    with pytest.raises(ChildProcessError):
        os.waitpid(proc.pid, os.WNOHANG)  # reaped: no zombie left behind


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace():
    proc = spawn("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)")
    started = time.monotonic()
    assert stop(proc, grace_s=0.2) == -9
    assert time.monotonic() - started < BOUND_S


def test_a_child_that_already_ended_is_only_reaped():
    proc = subprocess.Popen([sys.executable, "-c", "pass"], stdout=subprocess.PIPE)
    proc.stdout.read()  # EOF: it has ended (not reaped yet)
    assert stop(proc) == 0


def test_a_group_leader_takes_what_it_started_with_it():
    # The grandchild holds the pipe's write end: EOF on the read end means every holder has died.
    r, w = os.pipe()
    try:
        script = (f"import subprocess, time; subprocess.Popen(['sleep', '600'], pass_fds=[{w}]);"
                  " print('ready', flush=True); time.sleep(600)")
        proc = spawn(script, session=True, pass_fds=(w,))
        os.close(w)
        w = -1
        assert stop(proc) == -15
        assert closed_within(r, BOUND_S)
    finally:
        os.close(r)
        if w != -1:
            os.close(w)


def test_leftovers_that_ignore_sigterm_are_killed_once_the_leader_has_ended():
    r, w = os.pipe()
    try:
        # The grandchild ignores SIGTERM; the leader obeys it and ends first.
        script = ("import signal, subprocess, time;"
                  f" subprocess.Popen(['sh', '-c', 'trap \"\" TERM; echo up; exec sleep 600'], pass_fds=[{w}], stdout=subprocess.PIPE).stdout.readline();"
                  " print('ready', flush=True); time.sleep(600)")
        proc = spawn(script, session=True, pass_fds=(w,))
        os.close(w)
        w = -1
        started = time.monotonic()
        assert stop(proc, grace_s=5) == -15
        assert closed_within(r, BOUND_S)
        assert time.monotonic() - started < BOUND_S
    finally:
        os.close(r)
        if w != -1:
            os.close(w)


def test_a_child_in_our_own_group_is_signalled_alone():
    proc = spawn("import time; print('ready', flush=True); time.sleep(600)")
    assert os.getpgid(proc.pid) == os.getpgid(0)
    assert stop(proc) == -15  # and this test process, in the same group, is still here to check it

"""Stopping a child process, one way for the whole package: SIGTERM, a bounded wait, SIGKILL, reap.

A child started with ``start_new_session=True`` leads a process group of its
own; then the signals go to the whole group, so what the child started
(sudo's command, dpkg under debootstrap, a shell's pipeline) does not outlive
it, and whatever of the group is left once the child has ended is killed.
A child in gpurig's own group is signalled alone.
"""

from __future__ import annotations

import os
import signal
import subprocess

GRACE_S = 2.0


def stop(proc: subprocess.Popen, grace_s: float = GRACE_S) -> int:
    """End ``proc`` (and its group when it leads one) and reap it; its pipes are closed. Returns its exit code.

    SIGTERM first, SIGKILL when it has not ended after ``grace_s``. A child
    that has already ended is only reaped, and its group's leftovers killed.
    """
    if proc.returncode is None:  # not reaped yet, so the pid is still this child's (a zombie at worst)
        group = _own_group(proc)
        _send(proc, group, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            _send(proc, group, signal.SIGKILL)
            proc.wait()
        if group is not None:
            _send(proc, group, signal.SIGKILL)  # what the child started and left behind
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe and not pipe.closed:
            try:
                pipe.close()
            except OSError:
                pass  # a stdin whose reader is gone cannot flush; it is closed all the same
    return proc.returncode


def _own_group(proc: subprocess.Popen) -> int | None:
    try:
        return proc.pid if os.getpgid(proc.pid) == proc.pid else None
    except ProcessLookupError:
        return None


def _send(proc: subprocess.Popen, group: int | None, sig: int) -> None:
    try:
        if group is not None:
            os.killpg(group, sig)
        else:
            proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass  # gone already, or only root's processes are left (sudo relays the signal to those)

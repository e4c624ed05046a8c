"""A remote command's process group: how its shell tells its pid, and the script that ends the group.

sshd starts each command's shell with setsid, so the shell's pid is its
process group. The shell prints that pid before the command (``marked``);
``RemotePid`` takes the line off stderr. ``stop_line`` is the script, run in
a session of its own, that ends the group: SIGTERM, a bounded wait, SIGKILL.
Under sudo the login user cannot signal root's processes, but sudo relays
the TERM to the shell it runs, whose trap kills the whole group as root
(``gpurig.connect.connection``'s sudo wrapper). The script exits 0 once
nothing of the group is left, ``STILL_RUNNING`` when something is.
"""

from __future__ import annotations

import re
import time

_MARK = "@@gpurig-pid "
_LINE = re.compile(rb"@@gpurig-pid (\d+)\n")
STILL_RUNNING = 3

# `kill -s SIG -- -PGID`: the one spelling dash, bash and busybox all accept for a process group. A group
# whose processes the login user may not signal answers "not permitted": it is still there.
_STOP = (
    "g={pid}; alive() {{ e=$(kill -s 0 -- -$g 2>&1) && return 0; case $e in *ermit*) return 0;; esac; return 1; }}; "
    "kill -s TERM -- -$g 2>/dev/null; i=0; "
    "while [ $i -lt 30 ] && alive; do sleep 0.1; i=$((i+1)); done; "
    "kill -s KILL -- -$g 2>/dev/null; i=0; "
    "while [ $i -lt 20 ] && alive; do sleep 0.1; i=$((i+1)); done; "
    "if alive; then exit {still}; fi"
)


def marked(line: str) -> str:
    """``line`` preceded by its shell printing its pid (the process group) on stderr."""
    return f"printf '{_MARK}%s\\n' \"$$\" >&2\n{line}"


def stop_line(pid: int) -> str:
    """A shell line that ends process group ``pid`` and says by its exit status whether it is gone."""
    return _STOP.format(pid=int(pid), still=STILL_RUNNING)


class RemotePid:
    """Takes the remote shell's pid line off stderr (login files may print before it: they pass through)."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self._held = b""
        self._done = False

    def strip(self, data: bytes, final: bool = False) -> bytes:
        if self._done:
            return data
        self._held += data
        m = _LINE.search(self._held)
        if m:
            self.pid = int(m.group(1))
            out = self._held[: m.start()] + self._held[m.end():]
        elif final or len(self._held) > 4096:
            out = self._held  # no marker (a shell that could not print it): nothing to hold back
        else:
            return b""
        self._done, self._held = True, b""
        return out


def await_pid(chan, pid: RemotePid, seconds: float) -> None:
    """Read a channel's stderr up to ``seconds`` for its shell's pid line: sshd may forward a command's first stdout before it.

    The shell prints its pid before the command runs, so once the command has
    said anything (the moment a Ctrl-C often comes) the line is on its way;
    without it the command could not be stopped.
    """
    until = time.monotonic() + seconds
    while pid.pid is None and not chan.closed and time.monotonic() < until:
        if chan.recv_stderr_ready():
            pid.strip(chan.recv_stderr(65536))
        elif chan.exit_status_ready():
            return
        else:
            time.sleep(0.02)

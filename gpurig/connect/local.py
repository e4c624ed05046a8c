"""The machine gpurig runs on as a Connection: commands through /bin/sh, files by copy."""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from gpurig.connect.collect import OutputCollector
from gpurig.connect.connection import Connection, Result
from gpurig.connect.streams import Feeder
from gpurig.errors import HostError
from gpurig.process import stop


class LocalConnection(Connection):
    """Commands run in their own process group, so a timeout or an interrupt ends everything they started."""

    runs_here = True

    def _execute(self, line, shown, *, timeout, on_output, watcher=None, streams=None) -> Result:
        started = time.monotonic()
        proc = subprocess.Popen(
            ["/bin/sh", "-c", line],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # so a timeout can kill the whole process group
        )
        stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr
        assert stdin and stdout and stderr  # all three are PIPEs
        collect = OutputCollector(on_output, watcher)
        on_bytes = streams.on_bytes if streams else None
        feeder = None
        if streams and streams.feed:
            def write(data: bytes) -> None:
                stdin.write(data)
                stdin.flush()
            feeder = Feeder(streams.feed, write, stdin.close)
        elif watcher is None:
            stdin.close()
        sel = selectors.DefaultSelector()
        sel.register(stdout, selectors.EVENT_READ, "stdout")
        sel.register(stderr, selectors.EVENT_READ, "stderr")
        deadline = started + timeout if timeout else None
        try:
            while sel.get_map():
                wait = 0.25 if deadline is None else min(0.25, deadline - time.monotonic())
                if wait <= 0:
                    stop(proc)
                    raise self._timed_out(timeout, shown)
                if self.interrupted:
                    stop(proc)  # its whole group: it leads one of its own
                    raise self._interrupted_error()
                for key, _ in sel.select(wait):
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        collect.add(key.data, b"", final=True)
                        continue
                    if key.data == "stdout" and on_bytes is not None:
                        on_bytes(data)
                        continue
                    send, close = collect.add(key.data, data)
                    if send and not stdin.closed:
                        stdin.write(send)
                        stdin.flush()
                    if close and not stdin.closed:
                        stdin.close()
            exited = proc.wait()
            if feeder is not None:
                feeder.join()
        except BaseException:
            stop(proc)
            raise
        finally:
            if feeder is not None:
                feeder.stop()
            sel.close()
            for f in (proc.stdin, proc.stdout, proc.stderr):
                if f and not f.closed:
                    f.close()
        return Result(self.name, shown, exited, collect.text("stdout"), collect.text("stderr"), time.monotonic() - started)

    def put(self, local, remote, mode=None) -> None:
        dest = Path(remote)
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".gpurig-tmp")
            os.close(fd)
            shutil.copyfile(local, tmp)
            if mode is not None:
                os.chmod(tmp, mode)
            os.replace(tmp, dest)
        except OSError as err:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            raise HostError(f"cannot copy {local} to {remote}: {err.strerror}", "check both paths and permissions", host=self.name) from None

    def get(self, remote, local) -> None:
        self.put(remote, str(local))


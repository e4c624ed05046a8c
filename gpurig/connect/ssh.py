"""SSH connections (paramiko): the Connector that opens them (sharing jump-host transports), and SSHConnection: commands, files.

``Connector`` holds what a whole run shares: settings, known_hosts, the
parsed ~/.ssh/config, the sudo password, one transport per jump host. Its
``open(host)`` turns an inventory host into a local connection or an
``SSHConnection``, which only ever sees the resolved ``SSHTarget``
(``gpurig.connect.target``); ``gpurig.connect.transport`` opens the authenticated transports.
"""

from __future__ import annotations

import logging
import os
import secrets
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko

from gpurig.connect.collect import OutputCollector
from gpurig.connect.connection import (
    ChannelError,
    Connection,
    ConnectionLost,
    Result,
    UnreachableError,
    short_command,
)
from gpurig.connect.forward import LocalForward, Meter, ReverseForward
from gpurig.connect.hostkeys import check_policy
from gpurig.connect.remotegroup import STILL_RUNNING, RemotePid, await_pid, marked, stop_line
from gpurig.connect.streams import Feeder, OutputWake, SinkFailed, guarded_sink
from gpurig.connect.target import USER_SSH_CONFIG, SSHTarget
from gpurig.errors import HostError, last_line

if TYPE_CHECKING:
    from gpurig.connect.connector import Connector

log = logging.getLogger(__name__)
_STOP_WAIT_S = 8.0  # how long an interrupted command's stop script is awaited (it takes up to 5 s)

# paramiko logs every failed handshake with a traceback at ERROR. Its lines reach the console only
# at -vv (gpurig.report.configure_logging); until then a NullHandler keeps logging's last-resort printer away.
_PARAMIKO_LOG = logging.getLogger("paramiko")
_PARAMIKO_LOG.addHandler(logging.NullHandler())
_PARAMIKO_LOG.propagate = False




@dataclass(frozen=True)
class SSHSettings:
    """How connections are made; one value for the whole run."""

    connect_timeout: float = 10.0
    connect_attempts: int = 3
    retry_backoff_s: float = 0.5
    keepalive_s: float = 15.0
    command_timeout: float | None = None
    host_key_policy: str = "accept-new"
    project_known_hosts: Path = Path("inventory/known_hosts")
    user_known_hosts: Path | None = field(default_factory=lambda: Path("~/.ssh/known_hosts").expanduser())
    ssh_config: Path | None = field(default_factory=lambda: USER_SSH_CONFIG.expanduser())
    allow_agent: bool = True
    look_for_keys: bool = True

    def __post_init__(self) -> None:
        check_policy(self.host_key_policy)


# How long output may still come after the exit status when no EOF follows (a background child holds stdout).
_EOF_GRACE_S = 2.0
_PID_WAIT_S = 2.0  # how long an interrupted command's pid line is awaited when its output came first


class SSHConnection(Connection):
    """A host over SSH: one transport, opened lazily, reused for every command and transfer."""

    def __init__(self, name: str, connector: Connector, resolve: Callable[[], SSHTarget], *, become: bool = False) -> None:
        super().__init__(name, become=become, command_timeout=connector.settings.command_timeout, sudo_password=connector.sudo_password)
        self.settings = connector.settings
        self._connector = connector
        self._resolve = resolve
        self._target: SSHTarget | None = None
        self._transport: paramiko.Transport | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._streams: weakref.WeakSet[paramiko.Channel] = weakref.WeakSet()

    @property
    def closed(self) -> bool:
        """True once close() ran (the fleet closes every connection on Ctrl-C)."""
        return self._closed

    @property
    def ssh_target(self) -> SSHTarget:
        return self.target

    @property
    def target(self) -> SSHTarget:
        """Where this connection goes; resolved (and validated) on first use."""
        if self._target is None:
            self._target = self._resolve()
            self.user = self._target.user
        return self._target

    def _user_name(self) -> str:
        return self.target.user or super()._user_name()

    def connect(self) -> None:
        with self._lock:
            if self._closed:
                raise UnreachableError("connection was closed", "open a new connection", host=self.name)
            if self._transport is None or not self._transport.is_active():
                self._transport = self._connector.transport(self.target)

    def interrupt(self) -> None:
        """Commands stop with their process groups on the host (by the threads running them); streams and SFTP close now."""
        super().interrupt()
        sftp, self._sftp = self._sftp, None
        things: list[paramiko.Channel | paramiko.SFTPClient] = [*self._streams, *([sftp] if sftp else [])]
        for thing in things:
            try:
                thing.close()
            except Exception:  # a half-dead channel may raise on close; it is closed all the same
                pass

    def close(self) -> None:
        self._closed = True
        sftp, transport = self._sftp, self._transport
        self._sftp = self._transport = None
        for thing in (sftp, transport):
            if thing is not None:
                try:
                    thing.close()
                except Exception:  # closing a half-dead transport may raise; there is nothing left to do
                    pass

    def _live_transport(self) -> paramiko.Transport:
        """The connected transport, for what needs more than commands (channels, port forwards, engine streams)."""
        self.connect()
        transport = self._transport
        if transport is None:
            raise ConnectionLost("connection was closed", "open a new connection", host=self.name)
        return transport

    def host_key(self) -> str:
        key = self._live_transport().get_remote_server_key()  # checked against known_hosts when the connection opened
        return f"{key.get_name()} {key.get_base64()}"

    def open_channel(self, host: str, port: int, timeout: float = 30) -> paramiko.Channel:
        try:
            return self._live_transport().open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as err:  # ChannelException: the host's sshd said no, or nothing listens
            raise ChannelError(f"no channel to {host}:{port} on the host: {err or type(err).__name__}",
                               f"is something listening on the host's {host}:{port}, and is AllowTcpForwarding on?", host=self.name) from None

    def reverse_forward(self, target: tuple[str, int], meter: Meter | None = None) -> ReverseForward:
        forward = ReverseForward(self._live_transport(), target, meter)
        try:
            forward.open()
        except paramiko.SSHException as err:
            forward.close()
            raise ChannelError(f"the host's sshd refused a port forward ({last_line(str(err)) or 'AllowTcpForwarding no?'})",
                               "set AllowTcpForwarding yes (or remote) in the host's sshd_config", host=self.name) from None
        return forward

    def local_forward(self, host: str, port: int, meter: Meter | None = None) -> LocalForward:
        self._live_transport()  # connected now: a host that cannot be reached fails here, not on the first client's connection
        return LocalForward(lambda: self.open_channel(host, port), meter)

    def open_stream(self, line: str, timeout: float | None = None) -> paramiko.Channel:
        """A channel running ``line`` with its stdin/stdout as a byte stream (e.g. ``docker system dial-stdio``).

        The caller owns the channel and closes it; stderr stays readable for
        the reason when the stream ends early.
        """
        if self.interrupted:  # no new engine request once the run was interrupted (a retry, a cleanup)
            raise self._interrupted_error(started=False)
        transport = self._live_transport()
        try:
            chan = transport.open_session(timeout=self.settings.connect_timeout)
            chan.settimeout(timeout)
            chan.exec_command(line)
            self._streams.add(chan)  # interrupt() closes it
        except (paramiko.SSHException, OSError, EOFError) as err:
            raise ConnectionLost(f"could not open a stream: {err or type(err).__name__}", "check that the host is up and retry", host=self.name) from None
        return chan

    def stream_opener(self, line: str) -> Callable[[float | None], paramiko.Channel]:
        """Each call opens a new channel running ``line`` (``open_stream``)."""
        return lambda timeout: self.open_stream(line, timeout)

    def _execute(self, line, shown, *, timeout, on_output, watcher=None, streams=None) -> Result:
        self.connect()
        transport = self._transport  # close() from another thread (Ctrl-C) may set the attribute to None meanwhile
        if transport is None:
            raise ConnectionLost("connection closed before the command started", "", host=self.name)
        started = time.monotonic()
        try:
            chan = transport.open_session(timeout=self.settings.connect_timeout)
            chan.exec_command(marked(line))
        except (paramiko.SSHException, OSError, EOFError) as err:
            raise ConnectionLost(f"could not start a command: {err or type(err).__name__}", "check that the host is up and retry", host=self.name) from None
        collect = OutputCollector(on_output, watcher)
        pid = RemotePid()
        feed = streams.feed if streams else None
        on_bytes = guarded_sink(streams.on_bytes) if streams and streams.on_bytes else None
        feeder = Feeder(feed, chan.sendall, chan.shutdown_write) if feed else None
        if watcher is None and feeder is None:
            chan.shutdown_write()  # EOF on stdin: a command that reads it must not wait for us
        deadline = started + timeout if timeout else None
        exited_at: float | None = None
        wake = OutputWake(chan, batched=on_output is None and watcher is None and on_bytes is None)
        try:
            while True:
                wake.rearm()  # before looking: output that comes from here on ends the wait below at once
                got = False
                while chan.recv_ready():
                    got = True
                    data = chan.recv(65536)
                    if on_bytes is not None:
                        on_bytes(data)
                    else:
                        self._answer(chan, collect.add("stdout", data))
                while chan.recv_stderr_ready():
                    got = True
                    self._answer(chan, collect.add("stderr", pid.strip(chan.recv_stderr(65536))))
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    # sshd may send the exit status before the last of the output, which ends with EOF: wait for
                    # that, but only briefly when something the command left running holds its output open
                    exited_at = exited_at or time.monotonic()
                    if chan.eof_received or chan.closed or time.monotonic() - exited_at >= _EOF_GRACE_S:
                        break
                if chan.closed or (chan.eof_received and not got and not transport.is_active()):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    chan.close()
                    self._kill(transport, pid.pid)
                    raise self._timed_out(timeout, shown)
                if self.interrupted:
                    if pid.pid is None:
                        await_pid(chan, pid, _PID_WAIT_S)
                    chan.close()
                    raise self._interrupted_error(still_running=self._kill(transport, pid.pid, wait=_STOP_WAIT_S))
                if not got:
                    wait = 0.25 if deadline is None else max(0.0, min(0.25, deadline - time.monotonic()))
                    if exited_at is not None:
                        wait = max(0.0, min(wait, exited_at + _EOF_GRACE_S - time.monotonic()))
                    wake.wait(wait)
                    if self._closed:
                        raise ConnectionLost("connection closed while a command ran", "", host=self.name)
            # Drain what arrived together with the exit status.
            while chan.recv_ready():
                data = chan.recv(65536)
                on_bytes(data) if on_bytes is not None else collect.add("stdout", data)
            while chan.recv_stderr_ready():
                collect.add("stderr", pid.strip(chan.recv_stderr(65536)))
            collect.add("stderr", pid.strip(b"", final=True))
            collect.add("stdout", b"", final=True)
            collect.add("stderr", b"", final=True)
            exited = chan.recv_exit_status() if chan.exit_status_ready() else -1
        except SinkFailed as failed:  # writing what came failed here, not the connection
            self._kill(transport, pid.pid)
            raise failed.error from None
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise ConnectionLost(f"connection lost during {short_command(shown)}: {err or type(err).__name__}",
                "check that the host and its sshd are up", host=self.name) from None
        finally:
            chan.close()
            if feeder is not None:
                feeder.stop()
        if feeder is not None:
            feeder.join()
        if exited == -1:
            # The channel closed without an exit status: the session or the host went away.
            raise ConnectionLost(
                f"connection lost while running {short_command(shown)} (no exit status)",
                "check that the host and its sshd are up",
                host=self.name,
            )
        return Result(self.name, shown, exited, collect.text("stdout"), collect.text("stderr"), time.monotonic() - started)

    def _kill(self, transport: paramiko.Transport, pid: int | None, wait: float = 0.0) -> int | None:
        """Stop a command's process group on the host (closing its channel does not); the group when it may still run (0: unknown).

        Without ``wait`` (a timeout) the script is started and left to finish
        on its own. With it (an interrupt) its answer is awaited that long:
        the group, when the script did not say it is gone.
        """
        if pid is None:  # the command did not get to print it: nothing to stop it by
            return 0 if wait else None
        try:
            chan = transport.open_session(timeout=self.settings.connect_timeout)
            try:
                chan.exec_command(stop_line(pid))
                if not wait:
                    return None
                ended = chan.status_event.wait(wait)  # set by paramiko when the exit status arrives
                return None if ended and chan.recv_exit_status() != STILL_RUNNING else pid
            finally:
                chan.close()
        except (paramiko.SSHException, OSError, EOFError) as err:
            log.info("%s: could not stop the command's processes (pid %s): %s", self.name, pid, err)
            return pid

    @staticmethod
    def _answer(chan: paramiko.Channel, reply: tuple[bytes | None, bool]) -> None:
        send, close = reply
        if send:
            chan.sendall(send)
        if close:
            chan.shutdown_write()

    def _sftp_client(self) -> paramiko.SFTPClient:
        transport = self._live_transport()
        if self._sftp is None:
            try:
                self._sftp = transport.open_sftp_client()
            except (paramiko.SSHException, OSError, EOFError) as err:
                raise HostError(f"SFTP unavailable: {err}", "enable the sftp Subsystem in the host's sshd_config", host=self.name) from None
        return self._sftp

    def put(self, local, remote, mode=None) -> None:
        sftp = self._sftp_client()
        directory, _, name = remote.rpartition("/")
        tmp = f"{directory}/.{name}.gpurig-tmp-{secrets.token_hex(4)}" if directory else f".{name}.gpurig-tmp-{secrets.token_hex(4)}"
        try:
            with open(local, "rb") as f:
                sftp.putfo(f, tmp, confirm=True)
            if mode is not None:
                sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, remote)
        except (OSError, paramiko.SSHException) as err:
            try:
                sftp.remove(tmp)
            except (OSError, paramiko.SSHException):
                pass
            raise HostError(f"cannot put {local} to {remote}: {err}",
                "check the remote directory exists and is writable by the login user", host=self.name) from None

    def get(self, remote, local) -> None:
        sftp = self._sftp_client()
        dest = Path(local)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".gpurig-tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                sftp.getfo(remote, f)
            os.replace(tmp, dest)
        except (OSError, paramiko.SSHException) as err:
            Path(tmp).unlink(missing_ok=True)
            raise HostError(f"cannot get {remote}: {err}", "check the remote path exists and is readable by the login user", host=self.name) from None

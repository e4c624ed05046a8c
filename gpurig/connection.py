"""Connections to hosts: one interface (run / sudo / put / get) over SSH (paramiko) or locally, with host-key checking.

Everything above this module holds a ``Connection`` and never asks which kind
it is. ``Connector`` opens them with shared settings: timeouts, retries, the
host-key policy and known_hosts files, ``~/.ssh/config``, jump hosts and the
sudo password.

Commands are shell lines. Pass a list to have every element quoted with
``shlex.quote``; values from inventories or users must only ever reach a
shell that way (or through ``quote``).
"""

from __future__ import annotations

import base64
import codecs
import fcntl
import getpass
import hashlib
import logging
import os
import secrets
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import paramiko

from gpurig.errors import HostError
from gpurig.files import atomic_write
from gpurig.inventory import Host

log = logging.getLogger(__name__)

HOST_KEY_POLICIES = ("strict", "accept-new", "off")
SUDO_PASSWORD_ENV = "GPURIG_SUDO_PASSWORD"

Command = str | Sequence[str]
OutputHandler = Callable[[str, str], None]  # (stream name "stdout"|"stderr", text chunk)


# --- errors -----------------------------------------------------------------------------------


class ConnectError(HostError):
    """The host could not be connected to, trusted or logged into: nothing ran on it."""


class UnreachableError(ConnectError):
    """No SSH session could be set up (refused, timed out, no banner, jump host down)."""


class AuthError(ConnectError):
    """The server refused every key offered, or a key could not be loaded."""


class HostKeyError(ConnectError):
    """The host's key is unknown under the strict policy, or differs from the recorded one."""


class CommandError(HostError):
    """A command exited non-zero and the caller did not ask to ``warn`` instead."""

    def __init__(self, result: Result) -> None:
        last = (result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or [""])[-1]
        super().__init__(
            f"{result.host}: command exited {result.exited}: {_short(result.command)}" + (f": {last[:200]}" if last else ""),
            "run the command by hand on the host to see the whole output",
        )
        self.result = result


class CommandTimeout(HostError):
    """A command did not finish within its timeout; the session was closed."""


class ConnectionLost(HostError):
    """The connection dropped while a command ran (host died, sshd killed, network gone)."""


class SudoPasswordError(HostError):
    """sudo wanted a password that was missing or wrong."""


# --- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """What one command did: exit code and output, decoded as UTF-8."""

    host: str
    command: str
    exited: int
    stdout: str
    stderr: str
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exited == 0

    @property
    def failed(self) -> bool:
        return self.exited != 0


def quote(value: object) -> str:
    """A value made safe to place in a shell line as one literal word."""
    return shlex.quote(str(value))


def to_shell(command: Command) -> str:
    """A shell line from a string (used as is) or an argv list (each element quoted)."""
    if isinstance(command, str):
        return command
    return shlex.join(str(part) for part in command)


def fingerprint(key: paramiko.PKey) -> str:
    """SHA256 fingerprint written the way OpenSSH prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


# --- settings ---------------------------------------------------------------------------------


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
    ssh_config: Path | None = field(default_factory=lambda: Path("~/.ssh/config").expanduser())
    allow_agent: bool = True
    look_for_keys: bool = True

    def __post_init__(self) -> None:
        if self.host_key_policy not in HOST_KEY_POLICIES:
            raise HostError(
                f"unknown host-key policy {self.host_key_policy!r}",
                f"use one of: {', '.join(HOST_KEY_POLICIES)}",
            )


@dataclass(frozen=True)
class SSHTarget:
    """Where and as whom to connect, after inventory vars and ~/.ssh/config are combined."""

    name: str
    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    jumps: tuple[SSHTarget, ...] = ()

    @property
    def known_hosts_name(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


# --- host keys --------------------------------------------------------------------------------


class KnownHosts:
    """The user's known_hosts (read only) and the project's (read, and written under accept-new).

    Writes are atomic (temp file + rename) and serialised both between threads
    (a lock) and between processes (flock on the directory, which survives the
    rename unlike a lock on the file itself).
    """

    def __init__(self, project: Path, user: Path | None, policy: str) -> None:
        self.project = Path(project)
        self.user = user
        self.policy = policy
        self._lock = threading.Lock()
        self._user_keys = _load_host_keys(user) if user else paramiko.HostKeys()
        self._project_keys = _load_host_keys(self.project)

    def known_types(self, name: str) -> list[str]:
        found: list[str] = []
        for keys in (self._project_keys, self._user_keys):
            entry = keys.lookup(name)
            if entry:
                found.extend(t for t in entry.keys() if t not in found)
        return found

    def check(self, target: SSHTarget, key: paramiko.PKey) -> None:
        """Accept, record or refuse ``key`` for ``target`` according to the policy."""
        name = target.known_hosts_name
        with self._lock:
            known = self._known(name)
            if not known:
                # Another process may have recorded it since we loaded the file.
                self._project_keys = _load_host_keys(self.project)
                known = self._known(name)
            if any(k == key for _, k in known):
                return
            if known:
                raise self._changed(target, key, known)
            if self.policy == "strict":
                raise HostKeyError(
                    f"{target.name}: host key for {name} is not in {self.project} or {self.user} "
                    f"(offered {key.get_name()} {fingerprint(key)}) and the policy is strict",
                    f"check the fingerprint with the host's owner, then run "
                    f"'ssh-keyscan -p {target.port} {target.hostname} >> {self.project}' or use --host-key-policy accept-new",
                )
            if self.policy == "off":
                return
            self._record(name, key)

    def _known(self, name: str) -> list[tuple[Path | None, paramiko.PKey]]:
        found = []
        for path, keys in ((self.project, self._project_keys), (self.user, self._user_keys)):
            entry = keys.lookup(name)
            if entry:
                found.extend((path, k) for k in entry.values())
        return found

    def _changed(self, target: SSHTarget, key: paramiko.PKey, known: list[tuple[Path | None, paramiko.PKey]]) -> HostKeyError:
        recorded = ", ".join(f"{k.get_name()} {fingerprint(k)} in {p}" for p, k in known)
        files = sorted({str(p) for p, _ in known})
        removal = " and ".join(f"ssh-keygen -R {quote(target.known_hosts_name)} -f {quote(f)}" for f in files)
        return HostKeyError(
            f"{target.name}: HOST KEY CHANGED for {target.known_hosts_name}: offered {key.get_name()} "
            f"{fingerprint(key)}, recorded {recorded}; someone may be intercepting the connection",
            f"if the host was legitimately reinstalled, confirm the new fingerprint with its owner, "
            f"then run '{removal}' and connect again",
        )

    def _record(self, name: str, key: paramiko.PKey) -> None:
        self.project.parent.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(self.project.parent, os.O_RDONLY)
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX)
            try:
                current = self.project.read_text() if self.project.exists() else ""
            except OSError as err:
                raise HostError(f"cannot read {self.project}: {err.strerror}", "check its permissions") from None
            line = f"{name} {key.get_name()} {key.get_base64()}\n"
            if line not in current:
                if current and not current.endswith("\n"):
                    current += "\n"
                atomic_write(self.project, (current + line).encode())
            self._project_keys.add(name, key.get_name(), key)
            log.info("recorded host key %s %s for %s in %s", key.get_name(), fingerprint(key), name, self.project)
        finally:
            fcntl.flock(dir_fd, fcntl.LOCK_UN)
            os.close(dir_fd)


def _load_host_keys(path: Path) -> paramiko.HostKeys:
    keys = paramiko.HostKeys()
    if path and Path(path).exists():
        try:
            keys.load(str(path))
        except (OSError, paramiko.SSHException) as err:
            raise HostError(f"cannot read known_hosts file {path}: {err}", "fix or remove the damaged line") from None
    return keys


# --- the connection interface -----------------------------------------------------------------


class Connection:
    """run / sudo / put / get on one host. Subclasses provide ``_execute`` and file transfer."""

    def __init__(self, host: Host, settings: SSHSettings, sudo_password: Callable[[], str | None]) -> None:
        self.host = host
        self.settings = settings
        self._sudo_password = sudo_password

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Open the connection now (it otherwise opens on first use)."""

    def close(self) -> None:
        """Release the connection; safe to call twice and from another thread."""

    def run(
        self,
        command: Command,
        *,
        warn: bool = False,
        timeout: float | None = None,
        on_output: OutputHandler | None = None,
    ) -> Result:
        """Run a shell line (or an argv list, quoted) and return its Result.

        A non-zero exit raises CommandError unless ``warn``; ``timeout``
        (seconds) overrides the settings' command timeout.
        """
        line = to_shell(command)
        result = self._execute(line, line, timeout=self._timeout(timeout), on_output=on_output)
        return self._checked(result, warn)

    def sudo(
        self,
        command: Command,
        *,
        user: str | None = None,
        warn: bool = False,
        timeout: float | None = None,
        on_output: OutputHandler | None = None,
    ) -> Result:
        """Run a command through sudo, answering its password prompt when a password is configured.

        The password goes to sudo's stdin only after sudo prompts with a marker
        unique to this call, so it is never fed to a command that did not ask
        for it, and never logged or stored in the Result.
        """
        line = to_shell(command)
        as_user = ["-u", user] if user else []
        password = self._sudo_password()
        prompt = None
        if password is None:
            wrapped = shlex.join(["sudo", "-n", *as_user, "--", "sh", "-c", line])
        else:
            prompt = f"[gpurig-sudo-{secrets.token_hex(8)}]"
            # -k: ignore cached credentials, so the prompt (and our answer) is predictable;
            # the command's own stdin is /dev/null so it can never read the password.
            inner = "exec </dev/null; " + line
            wrapped = shlex.join(["sudo", "-S", "-k", "-p", prompt, *as_user, "--", "sh", "-c", inner])
        watcher = _SudoPrompt(prompt, password) if prompt else None
        result = self._execute(wrapped, f"sudo {line}", timeout=self._timeout(timeout), on_output=on_output, watcher=watcher)
        if watcher:
            result = _replace_stderr(result, watcher.clean(result.stderr))
            if watcher.asked > 1:
                raise SudoPasswordError(
                    f"{self.host.name}: sudo rejected the password for {self._user_name()}",
                    f"set the right password in ${SUDO_PASSWORD_ENV} or use --ask-sudo-password",
                )
        elif result.exited != 0 and "a password is required" in result.stderr:
            raise SudoPasswordError(
                f"{self.host.name}: sudo needs a password for {self._user_name()} and none was given",
                f"set ${SUDO_PASSWORD_ENV} or use --ask-sudo-password (or allow NOPASSWD in sudoers)",
            )
        return self._checked(result, warn)

    def put(self, local: str | Path, remote: str, mode: int | None = None) -> None:
        """Copy a local file to the host, atomically (temp name, then rename)."""
        raise NotImplementedError

    def get(self, remote: str, local: str | Path) -> None:
        """Copy a file from the host, atomically on this side."""
        raise NotImplementedError

    def _execute(
        self,
        line: str,
        shown: str,
        *,
        timeout: float | None,
        on_output: OutputHandler | None,
        watcher: _SudoPrompt | None = None,
    ) -> Result:
        raise NotImplementedError

    def _user_name(self) -> str:
        return self.host.user or getpass.getuser()

    def _timeout(self, timeout: float | None) -> float | None:
        return timeout if timeout is not None else self.settings.command_timeout

    def _checked(self, result: Result, warn: bool) -> Result:
        if result.exited != 0 and not warn:
            raise CommandError(result)
        return result


class _SudoPrompt:
    """Answers sudo's password prompt once; a second prompt means the password was wrong."""

    def __init__(self, prompt: str, password: str) -> None:
        self.prompt = prompt
        self._password = password
        self.asked = 0
        self._seen = ""

    def feed(self, stderr_text: str) -> tuple[bytes | None, bool]:
        """(bytes to send to stdin or None, whether to close stdin) after more stderr arrived."""
        self._seen += stderr_text
        count = self._seen.count(self.prompt)
        if count == self.asked:
            return None, False
        self.asked = count
        if count == 1:
            return (self._password + "\n").encode(), False
        return None, True  # wrong password: end sudo's retries with EOF instead of guessing again

    def clean(self, stderr: str) -> str:
        return stderr.replace(self.prompt, "")


def _replace_stderr(result: Result, stderr: str) -> Result:
    return Result(result.host, result.command, result.exited, result.stdout, stderr, result.duration_s)


class _Collector:
    """Gathers a command's output, decoding incrementally so streamed chunks never split a character."""

    def __init__(self, on_output: OutputHandler | None, watcher: _SudoPrompt | None) -> None:
        self.on_output = on_output
        self.watcher = watcher
        self.parts: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._decoders = {k: codecs.getincrementaldecoder("utf-8")("replace") for k in self.parts}

    def add(self, stream: str, data: bytes, final: bool = False) -> tuple[bytes | None, bool]:
        text = self._decoders[stream].decode(data, final)
        if not text:
            return None, False
        self.parts[stream].append(text)
        if self.on_output:
            shown = self.watcher.clean(text) if self.watcher else text
            if shown:
                self.on_output(stream, shown)
        if stream == "stderr" and self.watcher:
            return self.watcher.feed(text)
        return None, False

    def text(self, stream: str) -> str:
        return "".join(self.parts[stream])


# --- local ------------------------------------------------------------------------------------


class LocalConnection(Connection):
    """The machine gpurig runs on: commands through /bin/sh, files by copy."""

    def _execute(self, line, shown, *, timeout, on_output, watcher=None) -> Result:
        started = time.monotonic()
        proc = subprocess.Popen(
            ["/bin/sh", "-c", line],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # so a timeout can kill the whole process group
        )
        collect = _Collector(on_output, watcher)
        if watcher is None:
            proc.stdin.close()
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
        sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
        deadline = started + timeout if timeout else None
        try:
            while sel.get_map():
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    raise CommandTimeout(
                        f"{self.host.name}: command did not finish within {timeout:g}s: {_short(shown)}",
                        "raise the command timeout or find out why it hangs",
                    )
                for key, _ in sel.select(wait):
                    data = os.read(key.fileobj.fileno(), 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        collect.add(key.data, b"", final=True)
                        continue
                    send, close = collect.add(key.data, data)
                    if send and not proc.stdin.closed:
                        proc.stdin.write(send)
                        proc.stdin.flush()
                    if close and not proc.stdin.closed:
                        proc.stdin.close()
            exited = proc.wait()
        except BaseException:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise
        finally:
            sel.close()
            for f in (proc.stdin, proc.stdout, proc.stderr):
                if f and not f.closed:
                    f.close()
        return Result(self.host.name, shown, exited, collect.text("stdout"), collect.text("stderr"), time.monotonic() - started)

    def put(self, local, remote, mode=None) -> None:
        dest = Path(remote)
        try:
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".gpurig-tmp")
            os.close(fd)
            shutil.copyfile(local, tmp)
            if mode is not None:
                os.chmod(tmp, mode)
            os.replace(tmp, dest)
        except OSError as err:
            raise HostError(f"{self.host.name}: cannot copy {local} to {remote}: {err.strerror}", "check both paths and permissions") from None

    def get(self, remote, local) -> None:
        self.put(remote, str(local))


# --- SSH --------------------------------------------------------------------------------------

_KEY_CACHE: dict[tuple[str, float], paramiko.PKey] = {}
_KEY_LOCK = threading.Lock()


def _load_key(path: str) -> paramiko.PKey:
    """A private key from a file, parsed once per process (a fleet uses the same key a hundred times)."""
    try:
        stamp = (path, os.stat(path).st_mtime)
    except OSError as err:
        raise AuthError(f"cannot read key file {path}: {err.strerror}", "check ansible_ssh_private_key_file / IdentityFile") from None
    with _KEY_LOCK:
        if stamp in _KEY_CACHE:
            return _KEY_CACHE[stamp]
    try:
        key = paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        raise AuthError(f"key file {path} is encrypted", "load it into ssh-agent ('ssh-add KEY') so gpurig can use it") from None
    except (paramiko.SSHException, ValueError, OSError) as err:
        raise AuthError(f"cannot load key file {path}: {err}", "point ansible_ssh_private_key_file at an OpenSSH private key") from None
    with _KEY_LOCK:
        _KEY_CACHE[stamp] = key
    return key


class SSHConnection(Connection):
    """A host over SSH: one transport, opened lazily, reused for every command and transfer."""

    def __init__(self, host, settings, sudo_password, connector: Connector) -> None:
        super().__init__(host, settings, sudo_password)
        self._connector = connector
        self._transport: paramiko.Transport | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def target(self) -> SSHTarget:
        return self._connector.target(self.host)

    def connect(self) -> None:
        with self._lock:
            if self._closed:
                raise UnreachableError(f"{self.host.name}: connection was closed", "open a new connection")
            if self._transport is None or not self._transport.is_active():
                self._transport = self._connector.transport(self.target)

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

    def _execute(self, line, shown, *, timeout, on_output, watcher=None) -> Result:
        self.connect()
        started = time.monotonic()
        try:
            chan = self._transport.open_session(timeout=self.settings.connect_timeout)
            chan.exec_command(line)
        except (paramiko.SSHException, OSError, EOFError) as err:
            raise ConnectionLost(f"{self.host.name}: could not start a command: {err or type(err).__name__}", "check that the host is up and retry") from None
        collect = _Collector(on_output, watcher)
        if watcher is None:
            chan.shutdown_write()  # EOF on stdin: a command that reads it must not wait for us
        deadline = started + timeout if timeout else None
        sel = selectors.DefaultSelector()
        sel.register(chan, selectors.EVENT_READ)
        try:
            while True:
                got = False
                while chan.recv_ready():
                    got = True
                    self._answer(chan, collect.add("stdout", chan.recv(65536)))
                while chan.recv_stderr_ready():
                    got = True
                    self._answer(chan, collect.add("stderr", chan.recv_stderr(65536)))
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if chan.closed or (chan.eof_received and not got and not self._transport.is_active()):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    chan.close()
                    raise CommandTimeout(
                        f"{self.host.name}: command did not finish within {timeout:g}s: {_short(shown)}",
                        "raise the command timeout or find out why it hangs",
                    )
                if not got:
                    wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
                    sel.select(wait)
                    if self._closed:
                        raise ConnectionLost(f"{self.host.name}: connection closed while a command ran", "")
            # Drain what arrived together with the exit status.
            while chan.recv_ready():
                collect.add("stdout", chan.recv(65536))
            while chan.recv_stderr_ready():
                collect.add("stderr", chan.recv_stderr(65536))
            collect.add("stdout", b"", final=True)
            collect.add("stderr", b"", final=True)
            exited = chan.recv_exit_status() if chan.exit_status_ready() else -1
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise ConnectionLost(f"{self.host.name}: connection lost during {_short(shown)}: {err or type(err).__name__}", "check that the host and its sshd are up") from None
        finally:
            sel.close()
            chan.close()
        if exited == -1:
            # The channel closed without an exit status: the session or the host went away.
            raise ConnectionLost(
                f"{self.host.name}: connection lost while running {_short(shown)} (no exit status)",
                "check that the host and its sshd are up",
            )
        return Result(self.host.name, shown, exited, collect.text("stdout"), collect.text("stderr"), time.monotonic() - started)

    @staticmethod
    def _answer(chan: paramiko.Channel, reply: tuple[bytes | None, bool]) -> None:
        send, close = reply
        if send:
            chan.sendall(send)
        if close:
            chan.shutdown_write()

    def _sftp_client(self) -> paramiko.SFTPClient:
        self.connect()
        if self._sftp is None:
            try:
                self._sftp = self._transport.open_sftp_client()
            except (paramiko.SSHException, OSError, EOFError) as err:
                raise HostError(f"{self.host.name}: SFTP unavailable: {err}", "enable the sftp Subsystem in the host's sshd_config") from None
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
            raise HostError(f"{self.host.name}: cannot put {local} to {remote}: {err}", "check the remote directory exists and is writable by the login user") from None

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
            raise HostError(f"{self.host.name}: cannot get {remote}: {err}", "check the remote path exists and is readable by the login user") from None


# --- connector --------------------------------------------------------------------------------


class Connector:
    """Opens connections with shared settings, known_hosts, key cache and jump-host transports."""

    def __init__(self, settings: SSHSettings | None = None, sudo_password: str | Callable[[], str | None] | None = None) -> None:
        self.settings = settings or SSHSettings()
        self.known_hosts = KnownHosts(self.settings.project_known_hosts, self.settings.user_known_hosts, self.settings.host_key_policy)
        if self.settings.host_key_policy == "off":
            log.warning("HOST KEY CHECKING IS OFF: unknown host keys are accepted without being recorded")
        self._ssh_config = _load_ssh_config(self.settings.ssh_config)
        self._sudo = sudo_password
        self._sudo_lock = threading.Lock()
        self._jumps: dict[tuple[str, int, str], paramiko.Transport] = {}
        self._jump_lock = threading.Lock()
        self._stop = threading.Event()

    def open(self, host: Host) -> Connection:
        """A connection to ``host`` (local for ``ansible_connection: local``), not yet connected."""
        if host.is_local:
            return LocalConnection(host, self.settings, self.sudo_password)
        return SSHConnection(host, self.settings, self.sudo_password, self)

    def sudo_password(self) -> str | None:
        """The sudo password: given value, or from a callable asked once (e.g. a prompt), or $GPURIG_SUDO_PASSWORD."""
        with self._sudo_lock:
            if callable(self._sudo):
                self._sudo = self._sudo()
            if self._sudo is None:
                return os.environ.get(SUDO_PASSWORD_ENV)
            return self._sudo

    def stop(self) -> None:
        """Make pending retries give up at once (Ctrl-C)."""
        self._stop.set()

    def close(self) -> None:
        with self._jump_lock:
            jumps, self._jumps = list(self._jumps.values()), {}
        for t in jumps:
            t.close()

    def target(self, host: Host) -> SSHTarget:
        """Inventory vars over ~/.ssh/config, as ssh does with options given on its command line."""
        conf = self._ssh_config.lookup(host.address) if self._ssh_config else {}
        keys = [host.key_file] if host.key_file else []
        keys += [str(Path(k).expanduser()) for k in conf.get("identityfile", []) if k not in keys]
        jump = _jump_from_args(host.var("ansible_ssh_common_args", "")) or _jump_from_args(host.var("ansible_ssh_extra_args", ""))
        jump = jump or conf.get("proxyjump")
        return SSHTarget(
            name=host.name,
            hostname=conf.get("hostname", host.address),
            port=host.port or int(conf.get("port", 22)),
            user=host.user or conf.get("user") or getpass.getuser(),
            key_files=tuple(keys),
            jumps=self._jump_targets(jump, tuple(keys)),
        )

    def _jump_targets(self, spec: str | None, inherited_keys: tuple[str, ...]) -> tuple[SSHTarget, ...]:
        """Hops of a ProxyJump spec; a hop with no IdentityFile of its own offers the target's keys."""
        if not spec or spec == "none":
            return ()
        hops = []
        for hop in spec.split(","):
            user, _, rest = hop.rpartition("@")
            name, _, port = rest.partition(":")
            conf = self._ssh_config.lookup(name) if self._ssh_config else {}
            hops.append(
                SSHTarget(
                    name=f"jump {hop}",
                    hostname=conf.get("hostname", name),
                    port=int(port or conf.get("port", 22)),
                    user=user or conf.get("user") or getpass.getuser(),
                    key_files=tuple(str(Path(k).expanduser()) for k in conf.get("identityfile", [])) or inherited_keys,
                )
            )
        return tuple(hops)

    def transport(self, target: SSHTarget) -> paramiko.Transport:
        """An authenticated transport to ``target``, through its jump hosts if any."""
        via = None
        for i, hop in enumerate(target.jumps):
            via = self._jump(hop, via, target.jumps[:i])
        return self._connect(target, via)

    def _jump(self, hop: SSHTarget, via: paramiko.Transport | None, before: tuple[SSHTarget, ...]) -> paramiko.Transport:
        # One transport per jump host, shared by every host behind it: a bastion sees one login, not a hundred.
        key = (hop.hostname, hop.port, hop.user, tuple((b.hostname, b.port) for b in before))
        with self._jump_lock:
            t = self._jumps.get(key)
            if t is None or not t.is_active():
                t = self._connect(hop, via)
                self._jumps[key] = t
            return t

    def _connect(self, target: SSHTarget, via: paramiko.Transport | None) -> paramiko.Transport:
        s = self.settings
        last = ""
        for attempt in range(max(1, s.connect_attempts)):
            if attempt:
                # Connect failures are retried with exponential backoff; commands never are.
                if self._stop.wait(s.retry_backoff_s * 2 ** (attempt - 1)):
                    break
            sock = None
            transport = None
            try:
                sock = self._socket(target, via)
                transport = paramiko.Transport(sock)
                transport.banner_timeout = s.connect_timeout
                transport.handshake_timeout = s.connect_timeout
                transport.auth_timeout = s.connect_timeout
                known = self.known_hosts.known_types(target.known_hosts_name)
                if known:
                    # Ask for the key type we have on record, as OpenSSH does, so a host
                    # with several key types is not mistaken for one whose key changed.
                    opts = transport.get_security_options()
                    opts.key_types = [t for t in known if t in opts.key_types] + [t for t in opts.key_types if t not in known]
                transport.start_client(timeout=s.connect_timeout)
                if not transport.initial_kex_done:
                    # start_client returns quietly at its timeout while the banner wait goes on.
                    raise _ConnectFailure(f"no SSH handshake within {s.connect_timeout:g}s (is an SSH server listening there?)")
                break
            except _ConnectFailure as err:
                last = err.reason
            except (OSError, EOFError, paramiko.SSHException) as err:
                last = _describe_connect_error(err, s.connect_timeout)
            if transport is not None:
                transport.close()
            elif sock is not None:
                sock.close()
        else:
            raise UnreachableError(
                f"{target.name}: cannot connect to {target.user}@{target.hostname}:{target.port}: {last}"
                + (f" (after {s.connect_attempts} attempts)" if s.connect_attempts > 1 else ""),
                "check the host is up, the address/port in the inventory, and any firewall or jump host",
            )
        if self._stop.is_set() and (transport is None or not transport.is_active()):
            raise UnreachableError(f"{target.name}: interrupted while connecting", "")
        try:
            self.known_hosts.check(target, transport.get_remote_server_key())
            self._authenticate(transport, target)
        except BaseException:
            transport.close()
            raise
        if s.keepalive_s:
            transport.set_keepalive(int(max(1, s.keepalive_s)))
        return transport

    def _socket(self, target: SSHTarget, via: paramiko.Transport | None):
        if via is not None:
            try:
                return via.open_channel("direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=self.settings.connect_timeout)
            except paramiko.ChannelException as err:
                raise _ConnectFailure(f"jump host could not reach it: {err.text or err}") from None
        sock = socket.create_connection((target.hostname, target.port), timeout=self.settings.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.settings.keepalive_s:
            # TCP keepalive notices a host that vanished without closing the connection.
            idle = int(max(1, self.settings.keepalive_s))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, idle)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        return sock

    def _authenticate(self, transport: paramiko.Transport, target: SSHTarget) -> None:
        tried: list[str] = []
        for label, key in self._keys(target):
            tried.append(label)
            try:
                transport.auth_publickey(target.user, key)
            except paramiko.BadAuthenticationType as err:
                raise AuthError(
                    f"{target.name}: {target.hostname}:{target.port} does not accept public keys (allows {', '.join(err.allowed_types)})",
                    "enable PubkeyAuthentication on the host",
                ) from None
            except paramiko.AuthenticationException:
                continue
            except (paramiko.SSHException, OSError, EOFError) as err:
                raise UnreachableError(f"{target.name}: connection dropped during login: {err}", "check the host's sshd logs") from None
            if transport.is_authenticated():
                return
        raise AuthError(
            f"{target.name}: authentication failed for {target.user}@{target.hostname}:{target.port}: "
            + (f"server refused {', '.join(tried)}" if tried else "no key to offer"),
            f"add the public key to ~{target.user}/.ssh/authorized_keys on the host, "
            "or set ansible_ssh_private_key_file / IdentityFile to the right key",
        )

    def _keys(self, target: SSHTarget):
        for path in target.key_files:
            yield path, _load_key(path)
        if self.settings.allow_agent and os.environ.get("SSH_AUTH_SOCK"):
            try:
                agent_keys = paramiko.Agent().get_keys()
            except paramiko.SSHException:
                agent_keys = ()
            for key in agent_keys:
                yield f"agent key {fingerprint(key)}", key
        if self.settings.look_for_keys and not target.key_files:
            for name in ("id_ed25519", "id_ecdsa", "id_rsa"):
                path = Path("~/.ssh").expanduser() / name
                if path.exists():
                    try:
                        yield str(path), _load_key(str(path))
                    except AuthError:
                        continue  # an encrypted default key is skipped, as ssh does without a prompt


class _ConnectFailure(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _describe_connect_error(err: BaseException, timeout: float) -> str:
    if isinstance(err, ConnectionRefusedError):
        return "connection refused (nothing listening on that port)"
    if isinstance(err, socket.gaierror):
        return f"cannot resolve the host name ({err.strerror})"
    if isinstance(err, (socket.timeout, TimeoutError)):
        return f"timed out after {timeout:g}s"
    text = str(err) or type(err).__name__
    if "banner" in text.lower():
        return f"no SSH handshake within {timeout:g}s (is an SSH server listening there?)"
    if isinstance(err, EOFError) or "reset" in text.lower():
        return "the server closed the connection during the handshake"
    return text


def _load_ssh_config(path: Path | None) -> paramiko.SSHConfig | None:
    if not path or not Path(path).exists():
        return None
    try:
        return paramiko.SSHConfig.from_path(str(path))
    except (OSError, paramiko.ssh_exception.ConfigParseError) as err:
        raise HostError(f"cannot parse ssh config {path}: {err}", "fix that line or pass an empty --ssh-config") from None


def _jump_from_args(args: object) -> str | None:
    """ProxyJump from ansible_ssh_common_args: '-J host' or '-o ProxyJump=host'."""
    words = shlex.split(str(args or ""))
    for i, w in enumerate(words):
        if w == "-J" and i + 1 < len(words):
            return words[i + 1]
        if w.startswith("-J") and len(w) > 2:
            return w[2:]
        opt = words[i + 1] if w == "-o" and i + 1 < len(words) else (w[2:] if w.startswith("-o") else "")
        name, _, value = opt.replace("=", " ", 1).partition(" ")
        if name.lower() == "proxyjump" and value:
            return value.strip()
    return None


def _short(command: str, width: int = 80) -> str:
    command = " ".join(command.split())
    return command if len(command) <= width else command[: width - 3] + "..."

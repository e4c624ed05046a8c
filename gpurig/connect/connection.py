"""The Connection interface: run / sudo / put / get on one host, the Result of a command, its errors, quoting.

Everything above this module holds a ``Connection`` and never asks which kind
it is (``gpurig.connect.local`` or ``gpurig.connect.ssh``; ``gpurig.connect.connector.Connector`` opens
either from an inventory host).

Commands are shell lines. Pass a list to have every element quoted with
``shlex.quote``; values from inventories or users must only ever reach a
shell that way (or through ``quote``).
"""

from __future__ import annotations

import getpass
import secrets
import shlex
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpurig.connect.collect import SUDO_PASSWORD_ENV, OutputHandler, SudoPrompt
from gpurig.connect.streams import Streams
from gpurig.errors import HostError, error_line

if TYPE_CHECKING:
    import http.client

    from gpurig.connect.forward import LocalForward, Meter, ReverseForward
    from gpurig.connect.target import SSHTarget


# The command runs under a shell that kills its whole process group when sudo relays a TERM to it
# (a command timeout): the login user may signal sudo, but not the root processes it started.
_SUDO_SHELL = 'trap "kill -s KILL 0" TERM; sh -c "$1" & wait $!'

Command = str | Sequence[str]



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
        said = error_line(result.stderr) or error_line(result.stdout)
        super().__init__(
            f"command exited {result.exited}: {short_command(result.command)}" + (f": {said}" if said else ""),
            "run the command by hand on the host to see the whole output",
            host=result.host,
        )
        self.result = result


class CommandTimeout(HostError):
    """A command did not finish within its timeout; it was stopped."""


class ConnectionLost(HostError):
    """The connection dropped while a command ran (host died, sshd killed, network gone)."""


class CommandInterrupted(HostError):
    """gpurig was interrupted (Ctrl-C, SIGTERM) while a command ran, or before one started; the problem says where it stands."""


class ChannelError(HostError):
    """A channel or port forward the host could not give: the connection is not SSH, or the host's sshd refused it."""


class SudoPasswordError(HostError):
    """sudo wanted a password that was missing or wrong."""


# --- results and text -------------------------------------------------------------------------


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




def short_command(command: str, width: int = 80) -> str:
    """A command on one line, cut to ``width`` characters, for messages."""
    command = " ".join(command.split())
    return command if len(command) <= width else command[: width - 3] + "..."


# --- the connection interface -----------------------------------------------------------------


class Connection:
    """run / sudo / put / get on one host. Subclasses provide ``_execute`` and file transfer.

    ``name`` is the host's inventory name (it starts every error message),
    ``user`` the login user when known, ``become`` whether the inventory asks
    for privilege escalation (``ansible_become``).
    """

    def __init__(
        self,
        name: str,
        *,
        user: str | None = None,
        become: bool = False,
        command_timeout: float | None = None,
        sudo_password: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.name = name
        self.user = user
        self.become = become
        self.command_timeout = command_timeout
        self._sudo_password = sudo_password
        self._interrupted = threading.Event()
        self._passed_on: list[Connection] = []  # interrupted with this one (pass_interrupts_to)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    runs_here = False  # the machine gpurig itself runs on (ansible_connection: local): never rebooted, reached without SSH

    @property
    def closed(self) -> bool:
        """True once close() ran (the fleet closes every connection on Ctrl-C): waits on the host stop then."""
        return False

    @property
    def ssh_target(self) -> SSHTarget | None:
        """Where an ssh client reaches this host (address, port, login, keys, jumps); None for the machine gpurig runs on."""
        return None

    def connect(self) -> None:
        """Open the connection now (it otherwise opens on first use)."""

    def close(self) -> None:
        """Release the connection; safe to call twice and from another thread."""

    def interrupt(self) -> None:
        """Stop what runs on this connection (Ctrl-C): each command ends with every process it started, and no new one starts.

        Safe from another thread: the thread running a command notices within
        a fraction of a second, stops it, and raises ``CommandInterrupted``.
        """
        self._interrupted.set()
        for other in list(self._passed_on):
            other.interrupt()

    def pass_interrupts_to(self, other: Connection) -> None:
        """``other`` is interrupted whenever this one is: a second connection to the host that this one's work opened and waits
        on (fan-out's own, in a rollout), which the fleet's Ctrl-C does not know of."""
        self._passed_on.append(other)
        if self.interrupted:
            other.interrupt()

    @property
    def interrupted(self) -> bool:
        return self._interrupted.is_set()

    def _interrupted_error(self, started: bool = True, still_running: int | None = None) -> CommandInterrupted:
        """The error for a command stopped by ``interrupt``; ``still_running``: the process group left on the host, if any (0: unknown)."""
        if still_running is None:
            said = "interrupted; the command was stopped, with every process it started" if started else "interrupted before the command started"
            return CommandInterrupted(said,
                                      "run again: the work picks up where it stopped", host=self.name)
        if not still_running:
            return CommandInterrupted("interrupted as the command started; it may still be running on the host",
                                      "look at the host's processes, and run again once it has ended", host=self.name)
        return CommandInterrupted(f"interrupted; the command may still be running on the host as process group {still_running}",
                                  f"see it with `pgrep -a -g {still_running}` on the host, and run again once it has ended", host=self.name)

    def run(
        self,
        command: Command,
        *,
        warn: bool = False,
        timeout: float | None = None,
        on_output: OutputHandler | None = None,
        streams: Streams | None = None,
    ) -> Result:
        """Run a shell line (or an argv list, quoted) and return its Result.

        A non-zero exit raises CommandError unless ``warn``; ``timeout``
        (seconds) overrides the connection's command timeout.
        """
        line = to_shell(command)
        if self.interrupted:
            raise self._interrupted_error(started=False)
        result = self._execute(line, line, timeout=self._timeout(timeout), on_output=on_output, streams=streams)
        return self._checked(result, warn)

    def sudo(
        self,
        command: Command,
        *,
        user: str | None = None,
        warn: bool = False,
        timeout: float | None = None,
        on_output: OutputHandler | None = None,
        streams: Streams | None = None,
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
            wrapped = shlex.join(["sudo", "-n", *as_user, "--", "sh", "-c", _SUDO_SHELL, "sh", line])
        else:
            prompt = f"[gpurig-sudo-{secrets.token_hex(8)}]"
            # -k: ignore cached credentials, so the prompt (and our answer) is predictable;
            # the command's own stdin is /dev/null so it can never read the password.
            inner = "exec </dev/null; " + _SUDO_SHELL
            wrapped = shlex.join(["sudo", "-S", "-k", "-p", prompt, *as_user, "--", "sh", "-c", inner, "sh", line])
        watcher = SudoPrompt(prompt, password) if prompt and password is not None else None
        if watcher and streams and streams.feed:
            raise ValueError("sudo with a password reads it on stdin: no stdin can be fed to its command")
        if self.interrupted:
            raise self._interrupted_error(started=False)
        result = self._execute(wrapped, f"sudo {line}", timeout=self._timeout(timeout), on_output=on_output, watcher=watcher, streams=streams)
        if watcher:
            result = _replace_stderr(result, watcher.clean(result.stderr))
            if watcher.asked > 1:
                raise SudoPasswordError(
                    f"sudo rejected the password for {self._user_name()}",
                    f"set the right password in ${SUDO_PASSWORD_ENV} or use --ask-sudo-password",
                    host=self.name,
                )
        elif result.exited != 0 and "a password is required" in result.stderr:
            raise SudoPasswordError(
                f"sudo needs a password for {self._user_name()} and none was given",
                f"set ${SUDO_PASSWORD_ENV} or use --ask-sudo-password (or allow NOPASSWD in sudoers)",
                host=self.name,
            )
        return self._checked(result, warn)

    @property
    def needs_sudo(self) -> bool:
        """The one sudo rule: the inventory asks for become (``ansible_become``) and the login user is not root."""
        return self.become and self._user_name() != "root"

    def admin(self, command: Command, *, warn: bool = False, timeout: float | None = None,
              on_output: OutputHandler | None = None, streams: Streams | None = None) -> Result:
        """Run with the rights the inventory grants: through sudo when ``needs_sudo``, else as the login user."""
        if self.needs_sudo:
            return self.sudo(command, warn=warn, timeout=timeout, on_output=on_output, streams=streams)
        return self.run(command, warn=warn, timeout=timeout, on_output=on_output, streams=streams)

    def stream_opener(self, line: str) -> Callable[[float | None], object] | None:
        """A callable that starts ``line`` on the host and gives its stdin/stdout as one socket-like stream.

        None where the host is the machine gpurig runs on: its own sockets are
        reached directly (the Docker engine's unix socket, say).
        """
        return None

    def host_key(self) -> str | None:
        """The host key this connection checked, as an OpenSSH public key ("ssh-ed25519 AAAA..."); None where no SSH was used.

        What another machine pins to reach the same sshd (a host serving layers to its peers, say).
        """
        return None

    def open_channel(self, host: str, port: int, timeout: float = 30) -> Any:
        """A socket-like byte stream to ``host:port`` as the host sees it (its own loopback, say); the caller closes it.

        ``ChannelError`` where the connection is not SSH or the host's sshd
        refuses the channel (``AllowTcpForwarding``, nothing listening).
        """
        raise ChannelError(f"{host}:{port} on this host is reached through an SSH connection, and this one is local",
                           "reach the host over SSH (ansible_connection: ssh)", host=self.name)

    def http(self, host: str, port: int, timeout: float = 60) -> http.client.HTTPConnection:
        """An HTTP client whose connection is a channel to ``host:port`` as the host sees it (``open_channel``)."""
        from gpurig.connect.httpwire import ChannelHTTPConnection

        return ChannelHTTPConnection(lambda t: self.open_channel(host, port, 30 if t is None else t), host, port, timeout)

    def reverse_forward(self, target: tuple[str, int], meter: Meter | None = None) -> ReverseForward:
        """An open reverse forward: the host's 127.0.0.1:``port`` pumped to ``target`` on this machine; the caller closes it.

        ``ChannelError`` where the connection is not SSH or the host's sshd
        refuses to listen (``AllowTcpForwarding no``).
        """
        raise ChannelError("a port forward needs an SSH connection, and this one is local",
                           "reach the host over SSH (ansible_connection: ssh)", host=self.name)

    def local_forward(self, host: str, port: int, meter: Meter | None = None) -> LocalForward:
        """This machine's 127.0.0.1:PORT carried to ``host:port`` as the host sees it, a channel per connection; the caller closes it.

        ``ChannelError`` where the connection is not SSH.
        """
        raise ChannelError("a port forward needs an SSH connection, and this one is local",
                           "reach the host over SSH (ansible_connection: ssh)", host=self.name)

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
        watcher: SudoPrompt | None = None,
        streams: Streams | None = None,
    ) -> Result:
        raise NotImplementedError

    def _timed_out(self, timeout: float, shown: str) -> CommandTimeout:
        return CommandTimeout(
            f"command did not finish within {timeout:g}s: {short_command(shown)}",
            "raise the command timeout or find out why it hangs",
            host=self.name,
        )

    def _user_name(self) -> str:
        return self.user or getpass.getuser()

    def _timeout(self, timeout: float | None) -> float | None:
        return timeout if timeout is not None else self.command_timeout

    def _checked(self, result: Result, warn: bool) -> Result:
        if result.exited != 0 and not warn:
            raise CommandError(result)
        return result


def _replace_stderr(result: Result, stderr: str) -> Result:
    return Result(result.host, result.command, result.exited, result.stdout, stderr, result.duration_s)

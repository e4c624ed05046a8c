"""Opens a host's connection with the run's shared settings: known_hosts, the ssh config, jump-host transports, early logins, sudo's password.

SSH for every host but the one marked ``ansible_connection: local``. One
``Connector`` per run; each host's connection is opened lazily by the fleet.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable

import paramiko

from gpurig.connect.collect import env_sudo_password
from gpurig.connect.connection import Connection
from gpurig.connect.early import EarlyLogins, early_hosts
from gpurig.connect.hostkeys import KnownHosts
from gpurig.connect.local import LocalConnection
from gpurig.connect.ssh import SSHConnection, SSHSettings
from gpurig.connect.target import SSHTarget, load_ssh_config, resolve_target
from gpurig.connect.transport import open_transport
from gpurig.errors import GpurigError
from gpurig.inventory import Host

log = logging.getLogger("gpurig.connect.ssh")  # the logger the host-key warning always had


class Connector:
    """Opens connections with shared settings, known_hosts, ssh config and jump-host transports."""

    def __init__(
        self, settings: SSHSettings | None = None, sudo_password: str | Callable[[], str | None] | None = None, early: EarlyLogins | None = None
    ) -> None:
        self.settings = settings or SSHSettings()
        self.known_hosts = KnownHosts(self.settings.project_known_hosts, self.settings.user_known_hosts, self.settings.host_key_policy)
        if self.settings.host_key_policy == "off":
            log.warning("HOST KEY CHECKING IS OFF: unknown host keys are accepted without being recorded")
        self._ssh_config = load_ssh_config(self.settings.ssh_config)
        self._sudo = sudo_password
        self._sudo_lock = threading.Lock()
        env_sudo_password()  # out of the environment before any child is started
        self._jumps: dict[tuple, paramiko.Transport] = {}
        self._jump_lock = threading.Lock()
        self._early = early or EarlyLogins()  # ``early``: connect_early's, its TCP connects begun before this module loaded
        self._stop = self._early.stop

    def open(self, host: Host) -> Connection:
        """A connection to ``host`` (local for ``ansible_connection: local``), not yet connected.

        The SSH target is resolved, and the host's vars validated, on first use,
        so a bad host fails alone instead of stopping a fleet run.
        """
        if host.is_local:
            return LocalConnection(
                host.name, user=host.user, become=host.become, command_timeout=self.settings.command_timeout, sudo_password=self.sudo_password
            )
        return SSHConnection(host.name, self, lambda: resolve_target(host, self._ssh_config), become=host.become)

    def sudo_password(self) -> str | None:
        """The sudo password: given value, or from a callable asked once (e.g. a prompt), or $GPURIG_SUDO_PASSWORD."""
        with self._sudo_lock:
            if callable(self._sudo):
                self._sudo = self._sudo()
            if self._sudo is None:
                return env_sudo_password()
            return self._sudo

    def stop(self) -> None:
        """Make pending retries give up at once (Ctrl-C)."""
        self._stop.set()

    def close(self) -> None:
        self._early.close()
        with self._jump_lock:
            jumps, self._jumps = list(self._jumps.values()), {}
        for t in jumps:
            t.close()

    def start_early(self, hosts: Iterable[Host], forks: int) -> None:
        """Begin logging in to the first of ``hosts`` in the background, as many as the run's forks (EARLY_MAX at most).

        ``transport`` takes those logins; -f 1 still means one login at a time.
        A host whose vars make no target is left to the fleet, which reports it as before.
        """
        for host in early_hosts(hosts, forks):
            try:
                target = resolve_target(host, self._ssh_config)
            except GpurigError:
                continue
            self._early.start(target, functools.partial(self._login, target))

    def transport(self, target: SSHTarget) -> paramiko.Transport:
        """An authenticated transport to ``target``, through its jump hosts if any (the early login's, where one was started)."""
        return self._early.take(target) or self._login(target)

    def _login(self, target: SSHTarget) -> paramiko.Transport:
        via = None
        for i, hop in enumerate(target.jumps):
            via = self._jump(hop, via, target.jumps[:i])
        return open_transport(target, via, self.settings, self.known_hosts, self._stop, self._early.dialed)

    def _jump(self, hop: SSHTarget, via: paramiko.Transport | None, before: tuple[SSHTarget, ...]) -> paramiko.Transport:
        # One transport per jump host, shared by every host behind it: a bastion sees one login, not a hundred.
        key = (hop.hostname, hop.port, hop.user, tuple((b.hostname, b.port) for b in before))
        with self._jump_lock:
            t = self._jumps.get(key)
            if t is None or not t.is_active():
                t = open_transport(hop, via, self.settings, self.known_hosts, self._stop, self._early.dialed)
                self._jumps[key] = t
            return t

"""Logins started before the fleet asks for them, so the network's round trips hide the CPU a task spends meanwhile.

From connect() to the first command, a login is five round trips (TCP and
the banner, the key exchange, the service request with the signed key, the
session): 0.5 s at 100 ms RTT in which the process only waits. A one-host
command (``facts -l a100-01``, ``verify``, ``status``, ``logs``) meanwhile
imports its report and fleet code, reads the image spec and builds its
table. ``EarlyLogins`` runs each login in a thread from the moment the hosts
are chosen and checked; ``Connector.transport`` takes it when the fleet gets
to the host, with the error it met, raised there as it would have been.

The TCP connects go out first of all (``dial``), before paramiko and the
connection code are imported: sshd's banner comes two round trips after
connect(), and those imports fit in them instead of delaying the first SYN.
"""

from __future__ import annotations

import functools
import socket
import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpurig.connect.connection import UnreachableError
from gpurig.errors import GpurigError

if TYPE_CHECKING:
    import paramiko

    from gpurig.connect.target import SSHTarget
    from gpurig.inventory import Host

# At most this many logins run ahead of the fleet: the hosts a few-host command names. A fleet run beyond it
# gets no head start past its first hosts (its own forks bound it), so the early threads never double its load.
EARLY_MAX = 8
# From this many hosts a fleet run forks workers (gpurig.connect.spread; fewer: one process keeps up), and those get no
# early logins: a fork must not inherit login threads.
SPREAD_MIN = 256


def early_hosts(hosts: Iterable[Host], forks: int) -> list[Host]:
    """The hosts logged in to ahead: the first SSH hosts, as many as the run's forks (-f 1: one), EARLY_MAX at most."""
    return [h for h in hosts if not h.is_local][:max(1, min(forks, EARLY_MAX))]


class EarlyLogins:
    """TCP connects and logins under way or done, by address and by target; each is taken once, close() ends the untaken."""

    def __init__(self, stop: threading.Event | None = None) -> None:
        self.stop = stop or threading.Event()
        self._pending: dict[Hashable, Future[Any]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def dial(self, hosts: Sequence[Host], forks: int, timeout: float, ssh_config: Path | None) -> None:
        """Begin the TCP connect of each early host's first hop (its first jump host, else itself).

        Only the ssh config's parser loads paramiko, and only where there is a config.
        A host whose vars make no target is left to the fleet, which reports it as before.
        """
        from gpurig.connect.target import load_ssh_config, resolve_target

        config = load_ssh_config(ssh_config)
        for host in early_hosts(hosts, forks):
            try:
                target = resolve_target(host, config)
            except GpurigError:
                continue
            hop = target.jumps[0] if target.jumps else target
            address = (hop.hostname, hop.port)
            self._ahead(address, functools.partial(socket.create_connection, address, timeout), f"gpurig-dial-{hop.hostname}")

    def dialed(self, hostname: str, port: int) -> socket.socket | None:
        """The socket ``dial`` connected to (hostname, port) (waiting for it), or None where none was begun; its error is raised here."""
        return self._take((hostname, port))

    def start(self, target: SSHTarget, login: Callable[[], paramiko.Transport]) -> None:
        """Run ``login()`` for ``target`` in a thread of its own (one per target)."""
        self._ahead(target, login, f"gpurig-login-{target.name}")

    def take(self, target: SSHTarget) -> paramiko.Transport | None:
        """The transport the early login to ``target`` made (waiting for it), or None where none was started.

        Its error is raised here; a transport that died meanwhile counts as none.
        Ctrl-C (the connector's stop) ends the wait.
        """
        transport = self._take(target, host=target.name)
        if transport is None or transport.is_active():
            return transport
        transport.close()
        return None

    def close(self) -> None:
        """Close what was never taken; a connect or login still under way is closed when it ends."""
        with self._lock:
            self._closed = True
            futures, self._pending = list(self._pending.values()), {}
        for future in futures:
            future.add_done_callback(_close_result)

    def _ahead(self, key: Hashable, make: Callable[[], Any], name: str) -> None:
        future: Future[Any] = Future()
        with self._lock:
            if self._closed or key in self._pending:
                return
            self._pending[key] = future

        def run() -> None:
            future.set_running_or_notify_cancel()
            try:
                future.set_result(make())
            except BaseException as err:  # handed to whoever takes it, as if it had done the work itself
                future.set_exception(err)

        threading.Thread(target=run, name=name, daemon=True).start()

    def _take(self, key: Hashable, host: str = "") -> Any:
        with self._lock:
            future = self._pending.pop(key, None)
        if future is None:
            return None
        while True:
            try:
                return future.result(timeout=0.2)
            except FutureTimeout:
                if self.stop.is_set():
                    future.add_done_callback(_close_result)
                    raise UnreachableError("interrupted while connecting", "", host=host) from None


def _close_result(future: Future[Any]) -> None:
    if future.exception() is None:
        future.result().close()

"""Logins started before the fleet asks for them, so the network's round trips hide the CPU a task spends meanwhile.

From connect() to the first command, a login is six round trips (TCP, the
banner, the key exchange, the service request, the key, the session): 0.6 s
at 100 ms RTT in which the process only waits. A one-host command (``facts
-l a100-01``, ``verify``, ``status``, ``logs``) meanwhile imports its report
and fleet code, reads the image spec and builds its table. ``EarlyLogins``
runs each login in a thread from the moment the hosts are chosen and
checked; ``Connector.transport`` takes it when the fleet gets to the host,
with the error it met, raised there as it would have been.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

from gpurig.connect.connection import UnreachableError

if TYPE_CHECKING:
    import paramiko

    from gpurig.connect.target import SSHTarget

# At most this many logins run ahead of the fleet: the hosts a few-host command names. A fleet run beyond it
# gets no head start past its first hosts (its own forks bound it), so the early threads never double its load.
EARLY_MAX = 8


class EarlyLogins:
    """Logins under way or done, by target; each is taken once, and close() ends those never taken."""

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        self._pending: dict[SSHTarget, Future[paramiko.Transport]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def start(self, target: SSHTarget, login: Callable[[], paramiko.Transport]) -> None:
        """Run ``login()`` for ``target`` in a thread of its own (one per target)."""
        future: Future[paramiko.Transport] = Future()
        with self._lock:
            if self._closed or target in self._pending:
                return
            self._pending[target] = future

        def run() -> None:
            future.set_running_or_notify_cancel()
            try:
                future.set_result(login())
            except BaseException as err:  # handed to whoever takes it, as if it had connected itself
                future.set_exception(err)

        threading.Thread(target=run, name=f"gpurig-login-{target.name}", daemon=True).start()

    def take(self, target: SSHTarget) -> paramiko.Transport | None:
        """The transport the early login to ``target`` made (waiting for it), or None where none was started.

        Its error is raised here; a transport that died meanwhile counts as none.
        Ctrl-C (the connector's stop) ends the wait.
        """
        with self._lock:
            future = self._pending.pop(target, None)
        if future is None:
            return None
        while True:
            try:
                transport = future.result(timeout=0.2)
                break
            except FutureTimeout:
                if self._stop.is_set():
                    future.add_done_callback(_close_transport)
                    raise UnreachableError("interrupted while connecting", "", host=target.name) from None
        if transport.is_active():
            return transport
        transport.close()
        return None

    def close(self) -> None:
        """Close what was never taken; a login still under way is closed when it ends."""
        with self._lock:
            self._closed = True
            futures, self._pending = list(self._pending.values()), {}
        for future in futures:
            future.add_done_callback(_close_transport)


def _close_transport(future: Future[paramiko.Transport]) -> None:
    if future.exception() is None:
        future.result().close()

"""A fleet run spread over worker processes, one per core, so a thousand hosts are not bound by one core's GIL.

Up to a few hundred hosts one process keeps up: its threads mostly wait on
the network. Beyond that the controller's CPU (key exchange, ciphers, parsing
each host's output) sits on one core while the others idle. Here the hosts
are dealt round-robin to forked workers; each runs the ordinary threaded
fleet (``run_fleet``) on its share with its share of the forks, and sends
every host's progress and result back through a pipe. The parent only
relays: the display, the report in inventory order, Ctrl-C.

Workers are forked, not spawned: the host function is a closure over what
the task loaded, and a fork hands it over without pickling or re-importing.
So the fork happens before any thread of the run starts (the early logins
are not started for a run this big). Results cross back pickled: a task
whose host function keeps state across hosts (a dict it fills) must not
spread, and run_fleet spreads only when asked.

Ctrl-C reaches every worker (the terminal signals the process group; a
signal sent to the parent alone is passed on), and each stops its hosts as a
single-process run does; the parent waits for their last words and writes
the report of what finished. A worker that dies without them costs its
unfinished hosts, marked ``failed``, not the run.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import selectors
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpurig.connect.early import SPREAD_MIN
from gpurig.connect.fleet import STOP_WAIT_S, conclude, run_fleet
from gpurig.results import SIGINT_EXIT, FleetEvents, FleetInterrupted, FleetReport, HostResult
from gpurig.status import Status

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.connect.connector import Connector
    from gpurig.inventory import Host

HOSTS_PER_WORKER = 128  # no worker for fewer hosts than this: a fork and its logins cost more than they save
_FRAME = struct.Struct("!I")


def worker_count(hosts: int, cores: int | None = None) -> int:
    """How many worker processes a run over ``hosts`` gets: one per core available to gpurig, 1 for a small run."""
    cores = cores or len(os.sched_getaffinity(0))
    if hosts < SPREAD_MIN or cores < 2:
        return 1
    return max(1, min(cores, hosts // HOSTS_PER_WORKER))


def run_spread(
    hosts: Sequence[Host],
    work: Callable[[Connection], Any],
    *,
    connector: Connector,
    forks: int,
    workers: int,
    events: FleetEvents,
    label: str,
    report_path: str | Path | None,
) -> FleetReport:
    """``run_fleet`` over ``workers`` forked processes; the same report, the same events, the same Ctrl-C."""
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    connector.sudo_password()  # a prompt (-K) is answered once, here, not by every worker
    shares = [list(hosts[i::workers]) for i in range(workers)]
    per_worker = max(1, -(-forks // workers))
    results: dict[str, HostResult] = {}
    sel = selectors.DefaultSelector()
    children: dict[int, tuple[int, list[Host]]] = {}  # read fd -> (pid, share)
    try:
        for share in shares:
            rfd, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:  # the worker: never returns into the task
                os.close(rfd)
                _work_and_exit(share, work, connector, per_worker, label, wfd, [fd for fd in children])
            os.close(wfd)
            children[rfd] = (pid, share)
            sel.register(rfd, selectors.EVENT_READ, _Reader(rfd))
    except BaseException:
        _kill(children, reap=True)
        raise
    events.start(len(hosts), label)  # after the forks: a terminal's progress display runs a refresh thread
    ended: dict[int, tuple[bool, int]] = {}  # read fd -> the worker's (interrupted, stop code)
    try:
        interrupted, stop_code = _relay_all(sel, children, results, events, ended)
    except BaseException:
        _kill(children, reap=True)  # a bug here must not leave workers running the hosts
        raise
    finally:
        for key in list(sel.get_map().values()):
            os.close(key.fd)
        sel.close()
    for rfd, (pid, share) in children.items():
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            status = 0
        if rfd not in ended:
            why = f"internal error: worker process {pid} ended ({_ended(status)}) before reporting this host"
            for host in share:
                if host.name not in results:
                    results[host.name] = HostResult(host.name, Status.FAILED, "interrupted" if interrupted else why)
        else:
            worker_interrupted, worker_code = ended[rfd]
            if worker_interrupted and not interrupted:  # a signal only the workers got (the process group's SIGTERM)
                interrupted, stop_code = True, worker_code
    events.stop()
    return conclude(hosts, results, started_at, t0, interrupted, stop_code, report_path)


def _relay_all(sel: selectors.BaseSelector, children: dict, results: dict, events: FleetEvents, ended: dict) -> tuple[bool, int]:
    """Every worker's messages until each has closed its pipe: (interrupted, the exit code its signal asks for)."""
    interrupted, stop_code = False, 0
    deadline = None
    with _signals_noted(sel) as noted:
        while len(sel.get_map()) > 1:  # the workers' pipes and the signals' wake-up pipe
            ready = sel.select(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if noted and not interrupted:
                interrupted = True
                stop_code = 128 + signal.SIGTERM if signal.SIGTERM in noted else SIGINT_EXIT
                for pid, _ in children.values():
                    _signal(pid, signal.SIGTERM if signal.SIGTERM in noted else signal.SIGINT)  # a worker interrupts once
                deadline = time.monotonic() + STOP_WAIT_S + 10
            if deadline is not None and time.monotonic() >= deadline:
                _kill(children)  # a worker that did not stop its hosts in time: its share is lost, not the run's report
                break
            for key, _ in ready:
                if key.data is None:
                    os.read(key.fd, 512)  # the signals' wake-up bytes: what they said is in ``noted``
                    continue
                for message in key.data.read():
                    _relay(message, results, events, ended, key.fd)
                if key.data.eof:
                    sel.unregister(key.fd)
                    os.close(key.fd)
    return interrupted, stop_code


@contextlib.contextmanager
def _signals_noted(sel: selectors.BaseSelector) -> Iterator[list[int]]:
    """Ctrl-C and SIGTERM noted (not raised) while the parent relays, so no worker's message is lost half-read."""
    noted: list[int] = []
    rwake, wwake = os.pipe()
    os.set_blocking(wwake, False)
    sel.register(rwake, selectors.EVENT_READ, None)
    main = threading.current_thread() is threading.main_thread()
    if main:
        previous = {s: signal.signal(s, lambda signum, frame: noted.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
        wakeup = signal.set_wakeup_fd(wwake)
    try:
        yield noted
    finally:
        if main:
            signal.set_wakeup_fd(wakeup)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        sel.unregister(rwake)
        os.close(rwake)
        os.close(wwake)


class _Reader:
    """Frames from one worker's pipe: each a length and a pickle."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.eof = False

    def read(self) -> list[Any]:
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            self.eof = True
        self.buffer += chunk
        messages = []
        while len(self.buffer) >= _FRAME.size:
            (size,) = _FRAME.unpack_from(self.buffer)
            if len(self.buffer) < _FRAME.size + size:
                break
            messages.append(pickle.loads(self.buffer[_FRAME.size:_FRAME.size + size]))
            self.buffer = self.buffer[_FRAME.size + size:]
        return messages


def _relay(message: tuple, results: dict, events: FleetEvents, ended: dict, fd: int) -> None:
    kind = message[0]
    if kind == "state":
        events.state(message[1], message[2])
    elif kind == "finished":
        results[message[1].host] = message[1]
        events.finished(message[1])
    elif kind == "end":  # the hosts whose results no event carried (interrupted before they finished)
        _, rest, interrupted, code = message
        for result in rest:
            results.setdefault(result.host, result)
        ended[fd] = (interrupted, code)


class _PipeEvents(FleetEvents):
    """A worker's FleetEvents: each event a frame on the pipe to the parent (threads take turns)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()
        self.sent: set[str] = set()

    def send(self, message: tuple) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self.lock:
            view = memoryview(_FRAME.pack(len(data)) + data)
            while view:
                view = view[os.write(self.fd, view):]

    def state(self, host: str, state: str) -> None:
        self.send(("state", host, state))

    def finished(self, result: HostResult) -> None:
        try:
            self.send(("finished", result))
        except (pickle.PicklingError, TypeError, AttributeError) as err:  # data that cannot cross: the host says so
            self.send(("finished", HostResult(result.host, Status.FAILED, f"internal error: its result could not leave the worker: {err}",
                                              None, result.duration_s)))
        self.sent.add(result.host)


def _work_and_exit(share, work, connector, forks, label, wfd, inherited) -> None:
    """The worker's whole life: its share of the fleet, its last words, exit (no atexit, no flush of the parent's buffers)."""
    code = 0
    try:
        for fd in inherited:
            os.close(fd)
        _stop_once()
        pipe = _PipeEvents(wfd)
        try:
            report = run_fleet(share, work, connector=connector, forks=forks, events=pipe, label=label)
        except FleetInterrupted as stop:
            report = stop.report
        pipe.send(("end", tuple(r for r in report.results if r.host not in pipe.sent), report.interrupted, report.stop_code))
        connector.close()
    except BaseException:  # noqa: BLE001 - nothing may escape into the parent's task; the parent marks the share failed
        code = 70
    finally:
        os._exit(code)


class _Stopped(KeyboardInterrupt):
    """A worker's interrupt, with the exit code its signal asks for (run_fleet reads ``exit_code``)."""

    def __init__(self, signum: int) -> None:
        super().__init__("interrupted")
        self.exit_code = 128 + signum


def _stop_once() -> None:
    """Ctrl-C and SIGTERM each interrupt a worker once: the parent passes on a signal the terminal may have sent too."""
    signal.set_wakeup_fd(-1)

    def handler(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _Stopped(signum)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _kill(children: dict[int, tuple[int, list[Host]]], reap: bool = False) -> None:
    for pid, _ in children.values():
        _signal(pid, signal.SIGKILL)
    for pid, _ in children.values() if reap else ():
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit {os.waitstatus_to_exitcode(status)}"

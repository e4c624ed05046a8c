"""Runs one function over many hosts with bounded concurrency and returns a result per host.

Each host gets one connection, opened once and handed to the function for
all its work. A host that cannot be reached is ``unreachable``; one whose
work raised is ``failed``; neither stops the others. Ctrl-C (or SIGTERM)
stops starting new hosts, has each host's thread stop its running command
with every process it started on the host (``Connection.interrupt``),
closes every open connection and still writes the report for what finished.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpurig.config import DEFAULTS
from gpurig.connect.connection import CommandInterrupted, ConnectError, Connection
from gpurig.connect.connector import Connector
from gpurig.errors import GpurigError
from gpurig.inventory import Host
from gpurig.results import SIGINT_EXIT, FleetEvents, FleetInterrupted, FleetReport, HostResult, Outcome
from gpurig.status import Status

log = logging.getLogger(__name__)
STOP_WAIT_S = 10.0  # how long the hosts' threads get to stop their commands on the hosts before the connections close


def run_fleet(
    hosts: Iterable[Host],
    work: Callable[[Connection], Any],
    *,
    connector: Connector,
    forks: int | None = None,
    events: FleetEvents | None = None,
    report_path: str | Path | None = None,
    label: str = "running",
    workers: int = 1,
) -> FleetReport:
    """Run ``work(connection)`` on every host, at most ``forks`` at a time (default: the configured forks).

    ``work`` returns a value (status ``ok``, value kept as data) or an
    ``Outcome``. Exceptions become ``failed``; connection problems before
    ``work`` starts become ``unreachable``. ``events`` hears each host's
    progress. On Ctrl-C the report is written and FleetInterrupted raised.
    ``workers`` > 1 spreads the hosts over that many forked processes
    (``gpurig.connect.spread``): only for a ``work`` that keeps no state across
    hosts and returns picklable data.
    """
    hosts = list(hosts)
    forks = max(1, min(forks or DEFAULTS["forks"], len(hosts) or 1))
    display = events or FleetEvents()
    if workers > 1 and len(hosts) > 1:
        from gpurig.connect.spread import run_spread

        return run_spread(hosts, work, connector=connector, forks=forks, workers=min(workers, len(hosts)), events=display,
                          label=label, report_path=report_path)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    results: dict[str, HostResult] = {}
    open_conns: dict[str, Connection] = {}
    lock = threading.Lock()
    stopping = threading.Event()

    def one(host: Host) -> HostResult:
        if stopping.is_set():
            return HostResult(host.name, Status.FAILED, "interrupted before start")
        start = time.monotonic()
        conn = connector.open(host)
        with lock:
            open_conns[host.name] = conn
        try:
            display.state(host.name, "connecting")
            try:
                conn.connect()
            except ConnectError as err:
                return HostResult(host.name, Status.UNREACHABLE, err.problem, None, time.monotonic() - start, err.fix)
            display.state(host.name, "running")
            value = work(conn)
            if isinstance(value, Outcome):
                return HostResult(host.name, value.resolved, value.detail, value.data, time.monotonic() - start, value.fix)
            return HostResult(host.name, Status.OK, "", value, time.monotonic() - start)
        except GpurigError as err:
            if stopping.is_set() and not isinstance(err, CommandInterrupted):  # its own words say whether it still runs there
                return HostResult(host.name, Status.FAILED, "interrupted", None, time.monotonic() - start)
            return HostResult(host.name, Status.FAILED, err.problem, None, time.monotonic() - start, err.fix)
        except Exception as err:  # a bug in work() must cost one host, not the fleet
            log.exception("unexpected error on %s", host.name)
            reason = "interrupted" if stopping.is_set() else f"internal error: {type(err).__name__}: {err}"
            return HostResult(host.name, Status.FAILED, reason, None, time.monotonic() - start)
        finally:
            with lock:
                open_conns.pop(host.name, None)
            conn.close()

    def start(fut: Future, host: Host) -> None:
        if not fut.set_running_or_notify_cancel():  # a Ctrl-C cancelled it before it began
            return
        try:
            fut.set_result(one(host))
        except BaseException as err:  # raised in the main thread by its result(), as a pool's own future would
            fut.set_exception(err)

    pool = ThreadPoolExecutor(max_workers=forks, thread_name_prefix="gpurig-host")
    interrupted, stop_code = False, 0
    # Every host's future exists before any host starts, so a Ctrl-C, whenever it lands, finds them all; without a
    # barrier that would hold a hundred threads and wake them at once (about 1 ms of CPU a host more, bench_facts exec).
    pending: dict[Future, Host] = {Future(): h for h in hosts}
    try:
        display.start(len(hosts), label)
        for fut, h in list(pending.items()):
            pool.submit(start, fut, h)
        while pending:
            # A short wait keeps the main thread responsive to Ctrl-C.
            done, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for fut in done:
                host = pending.pop(fut)
                results[host.name] = fut.result()
                display.finished(results[host.name])
    except KeyboardInterrupt as stop:
        interrupted, stop_code = True, getattr(stop, "exit_code", SIGINT_EXIT)
        stopping.set()
        # Those not begun are cancelled: they touch nothing, and no one waits for them (a future of our own, cancelled, is not
        # "done" to wait() until a pool thread would have picked it up: waiting on it cost every Ctrl-C the full 15 s).
        begun = [fut for fut in pending if not fut.cancel()]
        connector.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        with lock:
            conns = list(open_conns.values())
        for conn in conns:
            conn.interrupt()  # each host's thread stops its command, with what it started there
        wait(begun, timeout=STOP_WAIT_S)
        for conn in conns:
            conn.close()  # unblocks threads still waiting on the network
        done, _ = wait(begun, timeout=5)
        for fut in done:
            if not fut.cancelled():
                results[pending[fut].name] = fut.result()
    finally:
        pool.shutdown(wait=not interrupted)
        display.stop()

    return conclude(hosts, results, started_at, t0, interrupted, stop_code, report_path)


def conclude(hosts: Sequence[Host], results: dict[str, HostResult], started_at: str, t0: float, interrupted: bool, stop_code: int,
             report_path: str | Path | None) -> FleetReport:
    """The report of a run, in inventory order (a host with no result was interrupted); written if asked; raised after Ctrl-C."""
    ordered = tuple(results.get(h.name) or HostResult(h.name, Status.FAILED, "interrupted") for h in hosts)
    summary = {s.value: sum(1 for r in ordered if r.status == s) for s in Status}
    report = FleetReport(ordered, started_at, time.monotonic() - t0, interrupted, summary, stop_code)
    if report_path:
        report.write_json(report_path)
    if interrupted:
        raise FleetInterrupted(report)
    return report

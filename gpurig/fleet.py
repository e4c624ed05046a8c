"""Runs one function over many hosts with bounded concurrency and returns a result per host.

Each host gets one connection, opened once and handed to the function for
all its work. A host that cannot be reached is ``unreachable``; one whose
work raised is ``failed``; neither stops the others. Ctrl-C stops starting
new hosts, closes every open connection and still returns (and writes) the
report for what finished.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpurig.connection import Connection, ConnectError
from gpurig.files import write_report
from gpurig.errors import GpurigError
from gpurig.inventory import Host
from gpurig.ssh import Connector

log = logging.getLogger(__name__)

STATUSES = ("ok", "changed", "failed", "unreachable")
# Work is I/O-bound (waiting on remote commands); 64 keeps a 2-core controller busy
# without opening more sessions at once than a typical sshd MaxStartups (10:30:100) allows.
DEFAULT_FORKS = 64
_STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "red", "unreachable": "magenta"}


@dataclass(frozen=True)
class Outcome:
    """What a host function may return to say it changed something; a plain value means ``ok``."""

    changed: bool = False
    data: Any = None
    detail: str = ""


@dataclass(frozen=True)
class HostResult:
    """One host's end state in a fleet run."""

    host: str
    status: str  # one of STATUSES
    reason: str = ""
    data: Any = None
    duration_s: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.status in ("ok", "changed")


@dataclass(frozen=True)
class FleetReport:
    """Every host's result, in inventory order, with a summary and an exit code."""

    results: tuple[HostResult, ...]
    started: str
    duration_s: float
    interrupted: bool = False
    summary: dict[str, int] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.interrupted or any(not r.succeeded for r in self.results)

    @property
    def exit_code(self) -> int:
        """0 when every host is ok or changed, 130 after Ctrl-C, 1 otherwise."""
        if self.interrupted:
            return 130
        return 1 if self.failed else 0

    def by_host(self) -> dict[str, HostResult]:
        return {r.host: r for r in self.results}

    def to_dict(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "duration_s": round(self.duration_s, 3),
            "interrupted": self.interrupted,
            "summary": self.summary,
            "hosts": [dataclasses.asdict(r) | {"duration_s": round(r.duration_s, 3)} for r in self.results],
        }

    def write_json(self, path: str | Path) -> None:
        """Write the report atomically: readers see the old file or the whole new one."""
        write_report(path, self.to_dict(), default=_jsonable)


def run_fleet(
    hosts: Iterable[Host],
    work: Callable[[Connection], Any],
    *,
    connector: Connector,
    forks: int | None = None,
    console: Console | None = None,
    progress: bool | None = None,
    report_path: str | Path | None = None,
    label: str = "running",
) -> FleetReport:
    """Run ``work(connection)`` on every host, at most ``forks`` at a time.

    ``work`` returns a value (status ``ok``, value kept as data) or an
    ``Outcome``. Exceptions become ``failed``; connection problems before
    ``work`` starts become ``unreachable``. On Ctrl-C the report is written
    and KeyboardInterrupt re-raised.
    """
    hosts = list(hosts)
    forks = max(1, forks or min(DEFAULT_FORKS, len(hosts) or 1))
    console = console or Console(stderr=True)
    show = console.is_terminal if progress is None else progress
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    results: dict[str, HostResult] = {}
    open_conns: dict[str, Connection] = {}
    lock = threading.Lock()
    stopping = threading.Event()

    display = _Display(console, len(hosts), label) if show else None

    def one(host: Host) -> HostResult:
        if stopping.is_set():
            return HostResult(host.name, "failed", "interrupted before start")
        start = time.monotonic()
        conn = connector.open(host)
        with lock:
            open_conns[host.name] = conn
        try:
            if display:
                display.state(host.name, "connecting")
            try:
                conn.connect()
            except ConnectError as err:
                return HostResult(host.name, "unreachable", _reason(host, err), None, time.monotonic() - start)
            if display:
                display.state(host.name, "running")
            value = work(conn)
            if isinstance(value, Outcome):
                status = "changed" if value.changed else "ok"
                return HostResult(host.name, status, value.detail, value.data, time.monotonic() - start)
            return HostResult(host.name, "ok", "", value, time.monotonic() - start)
        except GpurigError as err:
            reason = "interrupted" if stopping.is_set() else _reason(host, err)
            return HostResult(host.name, "failed", reason, None, time.monotonic() - start)
        except Exception as err:  # a bug in work() must cost one host, not the fleet
            log.exception("unexpected error on %s", host.name)
            reason = "interrupted" if stopping.is_set() else f"internal error: {type(err).__name__}: {err}"
            return HostResult(host.name, "failed", reason, None, time.monotonic() - start)
        finally:
            with lock:
                open_conns.pop(host.name, None)
            conn.close()

    pool = ThreadPoolExecutor(max_workers=forks, thread_name_prefix="gpurig-host")
    interrupted = False
    try:
        if display:
            display.start()
        pending: dict[Future, Host] = {pool.submit(one, h): h for h in hosts}
        while pending:
            # A short wait keeps the main thread responsive to Ctrl-C.
            done, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for fut in done:
                host = pending.pop(fut)
                results[host.name] = fut.result()
                if display:
                    display.finished(results[host.name])
    except KeyboardInterrupt:
        interrupted = True
        stopping.set()
        connector.stop()
        with lock:
            conns = list(open_conns.values())
        for conn in conns:
            conn.close()  # unblocks threads waiting on the network
        pool.shutdown(wait=False, cancel_futures=True)
        done, _ = wait(pending, timeout=5)
        for fut in done:
            if not fut.cancelled():
                results[pending[fut].name] = fut.result()
    finally:
        pool.shutdown(wait=not interrupted)
        if display:
            display.stop()

    ordered = tuple(results.get(h.name) or HostResult(h.name, "failed", "interrupted") for h in hosts)
    summary = {s: sum(1 for r in ordered if r.status == s) for s in STATUSES}
    report = FleetReport(ordered, started_at, time.monotonic() - t0, interrupted, summary)
    if report_path:
        report.write_json(report_path)
    if interrupted:
        raise FleetInterrupted(report)
    return report


class FleetInterrupted(KeyboardInterrupt):
    """Ctrl-C during a fleet run; carries the partial report (already written to disk if asked)."""

    def __init__(self, report: FleetReport) -> None:
        super().__init__("interrupted")
        self.report = report


def print_summary(report: FleetReport, console: Console) -> None:
    """One line per host that did not succeed, then the counts."""
    for r in report.results:
        if not r.succeeded:
            style = _STATUS_STYLE[r.status]
            console.print(f"[{style}]{r.status:<11}[/] {r.host}: {r.reason}", highlight=False, markup=True, soft_wrap=True)
    counts = "  ".join(f"[{_STATUS_STYLE[s]}]{s}={n}[/]" for s, n in report.summary.items())
    console.print(f"{len(report.results)} hosts in {report.duration_s:.1f}s  {counts}", highlight=False)


class _Display:
    """A progress bar with live counts of hosts connecting and running, and each host's line as it finishes."""

    def __init__(self, console: Console, total: int, label: str) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            TextColumn("[dim]{task.fields[busy]}"),
            console=console,
            transient=True,
        )
        self.counts = {s: 0 for s in STATUSES}
        self.busy: dict[str, str] = {}  # host -> connecting | running
        self._lock = threading.Lock()
        self.task = self.progress.add_task(label, total=total, counts="", busy="")

    def start(self) -> None:
        self.progress.start()

    def stop(self) -> None:
        self.progress.stop()

    def state(self, host: str, state: str) -> None:
        with self._lock:
            self.busy[host] = state
            self._show_busy()

    def _show_busy(self) -> None:
        connecting = sum(1 for s in self.busy.values() if s == "connecting")
        running = [h for h, s in self.busy.items() if s == "running"]
        shown = ", ".join(running[:3]) + (f" +{len(running) - 3}" if len(running) > 3 else "")
        text = (f"{connecting} connecting  " if connecting else "") + (f"running: {shown}" if running else "")
        self.progress.update(self.task, busy=text)

    def finished(self, r: HostResult) -> None:
        with self._lock:
            self.busy.pop(r.host, None)
            self._show_busy()
        self.counts[r.status] += 1
        style = _STATUS_STYLE[r.status]
        reason = f"  {r.reason}" if r.reason else ""
        self.progress.console.print(f"[{style}]{r.status:<11}[/] {r.host} ({r.duration_s:.1f}s){reason}", highlight=False)
        counts = " ".join(f"[{_STATUS_STYLE[s]}]{s}={n}[/]" for s, n in self.counts.items() if n)
        self.progress.update(self.task, advance=1, counts=counts)


def _reason(host: Host, err: Exception) -> str:
    """The error text without the host name it starts with: reports already say which host."""
    text = str(err)
    return text.removeprefix(f"{host.name}: ")


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return repr(value)

"""A fleet run as a person sees it: live progress, each host's line as it finishes, then the recap."""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from gpurig.errors import counted, explain
from gpurig.report import outside
from gpurig.results import FleetEvents, FleetReport, HostResult
from gpurig.status import STATUS_STYLE, Status
from gpurig.strict.validate import printable

# The recap's order (Ansible's).
RECAP = (Status.OK, Status.CHANGED, Status.UNREACHABLE, Status.FAILED, Status.SKIPPED)


class FleetProgress(FleetEvents):
    """A progress bar with live counts of hosts connecting and running, and each host's line as it finishes."""

    def __init__(self, console: Console) -> None:
        self.console = console
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
        self.counts = {s: 0 for s in Status}
        self.busy: dict[str, str] = {}  # host -> connecting | running
        self._lock = threading.Lock()
        self.task: TaskID | None = None

    def start(self, total: int, label: str) -> None:
        self.task = self.progress.add_task(label, total=total, counts="", busy="")
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
        shown = ", ".join(outside(h) for h in running[:3])  # the column reads markup + (f" +{len(running) - 3}" if len(running) > 3 else "")
        text = (f"{connecting} connecting  " if connecting else "") + (f"running: {shown}" if running else "")
        self._update(busy=text)

    def finished(self, r: HostResult) -> None:
        with self._lock:
            self.busy.pop(r.host, None)
            self._show_busy()
            self.counts[r.status] += 1
        line = status_text(r.status).append(f" {printable(r.host)} ({r.duration_s:.1f}s)")
        if r.reason:
            line.append(f"  {printable(r.reason)}")
        self.progress.console.print(line)
        counts = " ".join(f"[{STATUS_STYLE[s]}]{s}={n}[/]" for s, n in self.counts.items() if n)
        self._update(advance=1, counts=counts)

    def _update(self, **fields) -> None:
        if self.task is not None:  # nothing to update before start()
            self.progress.update(self.task, **fields)


class PlainProgress(FleetEvents):
    """Where no terminal is (a CI log, a pipe): a plain line every ``every`` seconds while a run lasts, none for a short one.

    A terminal gets ``FleetProgress``'s bar; a log would get nothing until the
    recap, so a 4-minute rollout looked hung. The line says how many hosts are
    done, their statuses so far, the hosts still running and the time spent.
    """

    def __init__(self, console: Console, every: float = 30.0) -> None:
        self.console = console
        self.every = every
        self.label = ""
        self.total = 0
        self.counts = {s: 0 for s in Status}
        self.busy: dict[str, str] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._ticker: threading.Thread | None = None
        self._started = 0.0

    def start(self, total: int, label: str) -> None:
        self.label, self.total, self._started = label, total, time.monotonic()
        self._ticker = threading.Thread(target=self._tick, daemon=True, name="gpurig-plain-progress")
        self._ticker.start()

    def stop(self) -> None:
        self._done.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)

    def state(self, host: str, state: str) -> None:
        with self._lock:
            self.busy[host] = state

    def finished(self, r: HostResult) -> None:
        with self._lock:
            self.busy.pop(r.host, None)
            self.counts[r.status] += 1

    def line(self) -> str:
        """The progress line as it stands now."""
        with self._lock:
            done = sum(self.counts.values())
            counts = " ".join(f"{s}={n}" for s, n in self.counts.items() if n)
            running = [h for h, s in self.busy.items() if s == "running"]
            connecting = sum(1 for s in self.busy.values() if s == "connecting")
        parts = [f"{self.label}: {done} of {counted(self.total, 'host')} done" + (f" ({counts})" if counts else "")]
        if running:
            parts.append("running: " + ", ".join(printable(h) for h in running[:3]) + (f" +{len(running) - 3}" if len(running) > 3 else ""))
        if connecting:
            parts.append(f"{connecting} connecting")
        parts.append(f"{time.monotonic() - self._started:.0f}s")
        return ", ".join(parts)

    def _tick(self) -> None:
        while not self._done.wait(self.every):
            self.console.print(Text(self.line()))


def status_text(status: Status) -> Text:
    return Text(f"{status:<11}", style=STATUS_STYLE.get(status, ""))


def host_counts(r: HostResult) -> dict[Status, int]:
    """Ansible's recap counts for one host: per step (or container) when the host's data is a list of results, else its status."""
    counts = {s: 0 for s in RECAP}
    statuses = _step_statuses(r.data) if r.status != Status.UNREACHABLE else None
    for status in statuses or [r.status]:
        counts[status] += 1
    return counts


def _step_statuses(data: Any) -> list[Status] | None:
    if isinstance(data, (list, tuple)) and data and all(isinstance(getattr(x, "status", None), Status) for x in data):
        return [x.status for x in data]
    return None


def print_recap(report: FleetReport, console: Console) -> None:
    """The run's one summary: why each host that did not succeed failed, an Ansible-style line per host, then their totals.

    The totals line adds up the lines above it (steps or containers where a
    host returned them), so every number in the summary counts the same things.
    """
    for r in report.results:
        if not r.succeeded:
            console.print(status_text(r.status).append(" " + printable(explain(r.reason, r.fix, r.host))))
    per_host = [(r, host_counts(r)) for r in report.results]
    width = max((len(printable(r.host)) for r in report.results), default=0)
    if per_host:  # one print of every host's line: a print each cost ~0.5 ms, a thousand hosts half a second
        console.print(Text("\n").join(_counts_line(Text(f"{printable(r.host):<{width}} :"), counts) for r, counts in per_host))
    totals = {s: sum(c[s] for _, c in per_host) for s in RECAP}
    head = Text(f"{counted(len(report.results), 'host')} in {report.duration_s:.1f}s:")
    console.print(_counts_line(head, totals))


def _counts_line(line: Text, counts: dict[Status, int]) -> Text:
    for status, n in counts.items():
        line.append(f" {status}={n}", style=STATUS_STYLE[status] if n else "dim")
    return line

"""Runs the sampler agent (checks/gpu_sampler.py) on a host through its Connection and streams its records into a Run.

The agent travels inside the command line (gpurig.connect.launcher, about 11 KB), so a
host needs nothing but python3: no copy step, no file left behind. The same
path serves the local host (a LocalConnection runs it as a subprocess).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from gpurig.connect.connection import Connection
from gpurig.connect.connector import Connector
from gpurig.connect.fleet import run_fleet
from gpurig.connect.launcher import embedded_line
from gpurig.errors import GpurigError, HostError, counted
from gpurig.inventory import Host
from gpurig.monitor import MonitorError
from gpurig.monitor.session import Run
from gpurig.results import FleetEvents, FleetReport
from gpurig.skeleton import shipped_text

if TYPE_CHECKING:
    from gpurig.monitor.idlestop import IdleStop

AGENT = "checks/gpu_sampler.py"  # as shipped (gpurig.skeleton.shipped finds it in a wheel as in a checkout)
CHUNK_S = 3600.0  # longest single agent run: its output stays in memory until it ends


def agent_source() -> str:
    """The sampler's source as this gpurig ships it; missing, unreadable or empty is one clear error before any host."""
    try:
        return shipped_text(AGENT)
    except GpurigError as err:
        raise MonitorError(err.problem, err.fix) from None


def agent_command(interval: float, duration: float, source: str | None = None, python: str = "python3") -> str:
    """The shell line that runs the agent from its source embedded in the line itself."""
    text = source if source is not None else agent_source()
    return embedded_line(text, PurePosixPath(AGENT).name, ["--interval", f"{interval:g}", "--duration", f"{duration:g}"], python)


class LineBuffer:
    """Cuts a stream of text chunks into whole lines; a chunk may end mid-line."""

    def __init__(self) -> None:
        self._rest = ""

    def feed(self, text: str) -> list[str]:
        data = self._rest + text
        *lines, self._rest = data.split("\n")
        return lines


class _Stopped(Exception):
    """Raised from the output callback to end a command when the run is stopped."""


def watch(
    conn: Connection,
    run: Run,
    interval: float,
    duration: float,
    command: str | None = None,
    stop: threading.Event | None = None,
    chunk: float = CHUNK_S,
    source: str | None = None,
) -> dict:
    """Stream the agent's records from ``conn`` into ``run`` until ``duration`` ends (0: until ``stop`` is set).

    Returns a summary of the host's run. Raises HostError when the agent
    cannot start or stops early; ConnectionLost (a HostError) when the host
    goes away: the fleet reports that host and the others go on. A run
    that ends with no sample read from the host is a HostError too: a host
    that was not watched must not count as watched. Once
    ``stop`` is set the agent is ended at its next record (the connection
    kills a local one, and a remote one dies with its SSH channel).

    A long run is cut into agent runs of ``chunk`` seconds on the same
    connection, because a Connection keeps a command's whole output until
    it ends: memory stays bounded at the cost of one interval's gap per chunk.
    """
    name = conn.name
    seen = {"sample": 0, "end": 0}
    stderr_tail: list[str] = []
    buf = LineBuffer()

    def on_output(stream: str, text: str) -> None:
        if stop is not None and stop.is_set():
            raise _Stopped()
        if stream != "stdout":
            stderr_tail[:] = (stderr_tail + text.splitlines())[-5:]
            return
        for line in buf.feed(text):
            try:
                record = json.loads(line)
            except ValueError:
                continue  # not ours (a login banner, a shell's message)
            if isinstance(record, dict):
                kind = record.get("type")
                if kind in seen:
                    seen[kind] += 1
                run.add(name, record)

    started = time.monotonic()

    def summary(**extra) -> dict:
        state = run.state(name)
        if not state.samples:
            raise no_samples(name, state.malformed, time.monotonic() - started, stopped=bool(extra.get("stopped")), why=stderr_tail[-1:])
        return {"samples": seen["sample"], "source": state.source, "notes": list(state.notes), **extra}

    left = duration
    while True:
        part = min(left, chunk) if duration else chunk
        ends_before = seen["end"]
        timeout = part + max(30.0, 5 * interval)
        try:
            result = conn.run(command or agent_command(interval, part, source), warn=True, timeout=timeout, on_output=on_output)
        except _Stopped:
            return summary(stopped=True)
        if result.exited == 127:
            raise HostError("python3 not found", "install python3 on the host (the sampler needs nothing else)", host=name)
        if result.exited != 0 or seen["end"] == ends_before:
            why = stderr_tail[-1] if stderr_tail else f"exit status {result.exited}"
            raise HostError(f"the sampler stopped after {counted(seen['sample'], 'sample')}: {why}",
                            "run checks/gpu_sampler.py on the host to see why", host=name)
        left -= part
        if duration and left < interval / 2:
            return summary()


def no_samples(host: str, malformed: int, seconds: float, *, stopped: bool = False, why: list[str] | tuple[str, ...] = ()) -> HostError:
    """The one line for a host the run got no sample from, saying why where it can."""
    if malformed:
        reason = f"its {counted(malformed, 'sample record')} could not be read (a sampler from another gpurig version?)"
    elif stopped:
        reason = "the run was stopped before its first sample"
    else:
        reason = "the sampler ended without sending one" + (f": {why[-1]}" if why else "")
    return HostError(f"no samples from this host in {seconds:.1f}s: {reason}; it was not watched",
                     "run checks/gpu_sampler.py --interval 1 --duration 3 on the host to see what it prints", host=host)


def monitor_fleet(
    hosts: list[Host],
    connector: Connector,
    run: Run,
    interval: float,
    duration: float,
    source: str | None = None,
    *,
    stop: threading.Event | None = None,
    events: FleetEvents | None = None,
    idle_stop: IdleStop | None = None,
) -> FleetReport:
    """Watch every host at once (one connection each) until ``duration`` ends, ``stop`` is set or Ctrl-C; a host that dies is
    reported, the rest go on.

    Ctrl-C ends the run like the end of ``duration``: every agent stops at its
    next sample and the report says what each host did. The fleet runs in a
    worker thread so that the interrupt reaches this one, which stops it. A
    caller that runs this in a thread of its own (the dashboard) ends it with
    ``stop``; ``events`` hears each host's end as it happens (a host that
    failed mid-run), not only in the report. ``idle_stop`` (gpurig.monitor.idlestop)
    hears every sample and stops the idle_stop containers whose GPUs sat idle,
    for as long as the run lasts.
    """
    source = source if source is not None else agent_source()  # before any host: a gpurig without its sampler says so once
    stop = stop if stop is not None else threading.Event()
    reports: list[FleetReport] = []
    errors: list[BaseException] = []

    def fleet() -> None:
        try:
            reports.append(run_fleet(
                hosts,
                lambda conn: watch(conn, run, interval, duration, stop=stop, source=source),
                connector=connector,
                forks=max(1, len(hosts)),  # every host streams for the whole run: none may wait for a slot
                events=events,
                label="monitor",
            ))
        except BaseException as err:  # handed to the caller's thread
            errors.append(err)
        finally:
            done.set()

    # An Event, not Thread.join: a join interrupted by Ctrl-C can leave is_alive() wrong.
    done = threading.Event()
    ended = threading.Event()  # the enforcer's: set when the run ends however it ends, ``stop`` being the caller's
    if idle_stop is not None:
        run.listeners.append(idle_stop.quiet)
        idle_stop.start(ended)
    threading.Thread(target=fleet, name="gpurig-monitor", daemon=True).start()
    try:
        while not done.wait(0.2):
            if stop.is_set():
                ended.set()
    except KeyboardInterrupt:
        stop.set()
        ended.set()
        if not done.wait(2 * interval + 10):  # a second Ctrl-C here ends gpurig at once
            raise
    finally:
        ended.set()
        if idle_stop is not None:
            idle_stop.join()
    if errors:
        raise errors[0]
    return reports[0]

"""The ``monitor`` task: watch GPUs, CPUs and memory across hosts; CSV, Prometheus, plot, record, and a diagnosis."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING

from invoke.exceptions import Exit

from gpurig.cli.options import host_task, select_hosts
from gpurig.errors import GpurigError
from gpurig.files import write_report
from gpurig.report import console, err_console, outside
from gpurig.strict.validate import excerpt, finite_number

if TYPE_CHECKING:
    from gpurig.flows.fleettask import HostOptions
    from gpurig.monitor.session import Run
    from gpurig.results import FleetReport

__all__ = ["monitor"]

_HELP = {
    "interval": "seconds between samples (default 1)",
    "duration": "stop after this many seconds (default: until Ctrl-C)",
    "csv": "write every sample to this CSV file, nvidia-smi's column names and units",
    "prometheus": "serve metrics for Prometheus on [ADDR:]PORT (dcgm-exporter names; address default 127.0.0.1)",
    "plot": "draw the run into this PNG file at the end",
    "json": "write the summary, the diagnosis and each host's result as JSON to this file (- = stdout)",
    "format": "table (default); the monitor's results are tables and its data is --csv/--json",
    "record": "keep the run (JSON lines) in this directory, for --replay later",
    "replay": "read a run recorded with --record instead of watching hosts (for --plot, --csv, the diagnosis)",
}


# Past this a wait's timeout overflows the C time types (threading refuses 1e300 s); a year is already "until Ctrl-C".
MAX_SECONDS = 366 * 86400.0


def _seconds(flag: str, value, default: float, minimum: float = 0.0) -> float:
    from gpurig.monitor import MonitorError

    if value is None:
        return default
    seconds = finite_number(value)
    if seconds is None or not minimum <= seconds <= MAX_SECONDS:
        raise MonitorError(
            f"{flag} {excerpt(value)} is not a number of seconds from {minimum:g} to {MAX_SECONDS:.0f}", f"give {flag} a number such as 1 or 0.5"
        )
    return seconds


SCHEMA = "gpurig.monitor/1"


@host_task(help=_HELP)
def monitor(c, opts: HostOptions, interval=None, duration=None, csv=None, prometheus=None, plot=None, record=None, replay=None):
    """Watch GPU, CPU and memory use across hosts: live view, CSV, Prometheus, plot, and why the GPU is idle.

    While it watches, a container deployed with idle_stop (gpurig_containers) is stopped once every GPU it holds sat under 5%
    that long; each stop is said on stderr first and kept in .gpurig/history/idle-stop.jsonl.
    """
    from gpurig.monitor.csvfile import write_csv
    from gpurig.monitor.diagnose import diagnose
    from gpurig.monitor.record import load_run

    interval_s = _seconds("--interval", interval, 1.0, minimum=0.05)
    duration_s = _seconds("--duration", duration, 0.0)
    report: FleetReport | None = None
    if replay:
        run = load_run(replay)
        if csv:
            write_csv(csv, [s for h in run.hosts() for s in run.series(h)])
    else:
        run, report = _watch(opts, interval_s, duration_s, csv, prometheus, record)
    findings = diagnose(run)
    _present(run, findings, report, err_console if opts.json == "-" else console)  # --json -: stdout is the JSON
    if plot:
        from gpurig.monitor.plot import plot as draw_plot  # matplotlib: ~1 s to import, only when a plot is asked for

        draw_plot(run, plot)
        err_console.print(f"plot: {outside(plot)}")
    if opts.json:
        write_report(opts.json, _report_data(opts, run, findings, report))
    if report is not None and report.exit_code:
        raise Exit(code=report.exit_code)


def _watch(opts: HostOptions, interval, duration, csv, prometheus, record) -> tuple[Run, FleetReport]:
    from rich.live import Live

    from gpurig.flows.fleettask import make_connector
    from gpurig.monitor.agent import agent_source, monitor_fleet
    from gpurig.monitor.csvfile import CsvWriter
    from gpurig.monitor.idlestop import enforcer
    from gpurig.monitor.record import Recorder
    from gpurig.monitor.session import Run

    hosts = select_hosts(opts)
    run = Run()
    # Everything that can refuse to start does so before any file is created: a gpurig without its sampler first.
    source = agent_source()
    exporter = None
    if prometheus:
        from gpurig.monitor.exporter import parse_listen, serve  # prometheus_client only when asked for

        exporter = serve(run, *parse_listen(prometheus), stale_after=max(10.0, 3 * interval))
    writer = recorder = live = None
    try:
        writer = CsvWriter(csv) if csv else None  # a temporary file until the run ends
        recorder = Recorder(record) if record else None
    except BaseException:
        if writer:
            writer.discard()
        if exporter:
            exporter.close()
        raise
    run.listeners += [sink for sink in (recorder, writer) if sink]
    connector = make_connector(opts)
    started = time.time()
    try:
        if exporter:
            err_console.print(f"prometheus: scrape {outside(exporter.url)}{outside(_dashboard())}")
        if console.is_terminal:
            live = Live(get_renderable=lambda: _live(run, interval), console=console, refresh_per_second=max(1, min(4, 1 / interval)), transient=True)
            live.start()
        stopper = enforcer(hosts, opts.settings.inventory, lambda: make_connector(opts), _say, opts.settings.project, interval)
        report = monitor_fleet(hosts, connector, run, interval, duration, source, idle_stop=stopper)  # Ctrl-C ends it like --duration
    finally:
        if live:
            live.stop()
        if exporter:
            exporter.close()
        connector.close()
        if writer:
            writer.close()
        if recorder:
            recorder.close({"started": started, "interval": interval, "duration": duration, "hosts": [h.name for h in hosts]})
    if csv:
        err_console.print(f"csv: {outside(csv)}")
    return run, report


def _say(line: str) -> None:
    """An idle_stop line (a container stopped for its idle GPUs, or why one could not be), on stderr."""
    err_console.print(f"idle_stop: {outside(line)}", highlight=False, soft_wrap=True)


def _dashboard() -> str:
    """' (Grafana dashboard: PATH)' for the one gpurig ships, wherever this copy is installed; '' if it lacks it (monitoring goes on)."""
    from gpurig.skeleton import shipped

    try:
        return f" (Grafana dashboard: {shipped('gpurig/monitor/grafana-dashboard.json')})"
    except GpurigError:
        return ""


def _live(run: Run, interval: float):
    """The live table; a host silent for three intervals is shown as such, not with its last figures."""
    from gpurig.monitor.live import live_table

    latest = run.latest()
    now = time.time()
    silent = {h: f"no sample for {now - s.t:.0f}s" for h, s in latest.items() if now - s.t > max(3 * interval, 3.0)}
    return live_table(latest, failed=silent, width=console.width)


def _present(run: Run, findings, report: FleetReport | None, out) -> None:
    from gpurig.monitor.live import findings_view, summary_table
    from gpurig.report.fleetrun import print_recap

    notes: dict[str, list[str]] = defaultdict(list)
    for host in run.hosts():
        for note in run.state(host).notes:
            notes[note].append(host)
    for note, hosts in notes.items():
        err_console.print(f"[yellow]note[/] {', '.join(outside(h) for h in hosts)}: {outside(note)}")
    out.print(summary_table(run, width=out.width))
    out.print(findings_view(findings))
    if report is not None:
        print_recap(report, err_console)


def _report_data(opts: HostOptions, run: Run, findings, report: FleetReport | None) -> dict:
    from gpurig.flows.fleettask import fleet_document

    hosts = {}
    for host in run.hosts():
        state = run.state(host)
        series = run.series(host)
        hosts[host] = {
            "source": state.source,
            "notes": state.notes,
            "samples": len(series),
            "first": series[0].t if series else None,
            "last": series[-1].t if series else None,
        }
    body = {"hosts": hosts, "findings": [vars(f) for f in findings]}
    if report is None:
        return {"schema": SCHEMA, **body, "fleet": None}
    return {**fleet_document(opts, report, SCHEMA), **body, "fleet": report.to_dict()}



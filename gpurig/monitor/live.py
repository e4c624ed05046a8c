"""What the terminal shows (rich renderables, built here, printed by the CLI): the live table, the summary and the diagnosis."""

from __future__ import annotations

from statistics import mean

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpurig.monitor.diagnose import Finding
from gpurig.monitor.samples import Sample
from gpurig.monitor.session import Run
from gpurig.strict.validate import printable


def _shown(text: object) -> Text:
    """A recorded host name or source as a cell: data, never markup, its control characters shown as escapes."""
    return Text(printable(text))


def _n(value, fmt="{:.0f}", none="-") -> str:
    return none if value is None else fmt.format(value)


def live_table(latest: dict[str, Sample], failed: dict[str, str] | None = None) -> Table:
    """One row per GPU (or per host without GPUs), in 80 columns: host, GPU, util, SM, memory, temp, power, CPU, RAM."""
    caption = "\n".join(f"{printable(h)}: {why}" for h, why in sorted((failed or {}).items())) or None
    table = Table(
        "host", "gpu", "util", "sm", "mem GiB", "°C", "W", "cpu", "core", "ram",
        box=None, pad_edge=False, header_style="bold", caption=caption, caption_style="red", caption_justify="left",
    )  # fmt: skip
    for host in sorted(set(latest) - set(failed or {})):
        s = latest[host]
        cpu = (f"{s.cpu_percent:.0f}%", f"{s.max_core:.0f}%", f"{s.mem_used / 2**30:.0f}/{s.mem_total / 2**30:.0f}G")
        if not s.gpus:
            table.add_row(_shown(host[:14]), "-", "", "", "", "", "", *cpu)
        for g in s.gpus:
            mem = f"{g.mem_used_mib / 1024:.0f}/{g.mem_total_mib / 1024:.0f}" if g.mem_used_mib is not None and g.mem_total_mib else "-"
            table.add_row(
                _shown(host[:14]), str(g.index), _n(g.util_gpu, "{:.0f}%"), _n(g.sm_active, "{:.0%}"), mem,
                _n(g.temp_c), _n(g.power_w), *cpu,
            )  # fmt: skip
    return table


def summary_table(run: Run) -> Table:
    """Per host and GPU over the whole run: samples, mean utilisation and SM activity, peak memory, CPU."""
    table = Table("host", "gpu", "n", "util", "sm", "mem peak", "cpu", "core", "source", header_style="bold")
    for host in run.hosts():
        series = run.series(host)
        state = run.state(host)
        if not series:
            continue
        cpu = f"{mean(s.cpu_percent for s in series):.0f}%"
        core = f"{mean(s.max_core for s in series):.0f}%"
        indices = sorted({g.index for s in series for g in s.gpus})
        if not indices:
            table.add_row(_shown(host), "-", str(len(series)), "", "", "", cpu, core, _shown(state.source))
        for i in indices:
            gs = [g for s in series for g in s.gpus if g.index == i]
            util = [g.util_gpu for g in gs if g.util_gpu is not None]
            sm = [g.sm_active for g in gs if g.sm_active is not None]
            mem = [g.mem_fraction for g in gs if g.mem_fraction is not None]
            table.add_row(
                _shown(host), str(i), str(len(gs)), f"{mean(util):.0f}%" if util else "-", f"{mean(sm):.0%}" if sm else "-",
                f"{max(mem):.0%}" if mem else "-", cpu, core, _shown(state.source),
            )  # fmt: skip
    return table


def findings_view(findings: list[Finding]) -> Group:
    """Each finding as three lines: what, the evidence, the fix."""
    if not findings:
        return Group(Text("diagnosis: nothing stands out", style="green"))
    parts = [Text("diagnosis:", style="bold")]
    for f in findings:
        where = f"{f.host} GPU {f.gpu}" if f.gpu is not None else f.host
        parts.append(Text.assemble((f"[{f.rule}] ", "bold yellow"), printable(f"{where}: {f.title}")))
        parts.append(Text(printable(f"  evidence: {f.evidence}")))
        parts.append(Text(printable(f"  fix: {f.fix}"), style="cyan"))
    return Group(*parts)

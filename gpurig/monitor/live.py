"""What the terminal shows (rich renderables, built here, printed by the CLI): the live table, the summary and the diagnosis."""

from __future__ import annotations

from statistics import mean

from rich.cells import cell_len
from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpurig.monitor.diagnose import Finding
from gpurig.monitor.samples import GpuSample, HpcJob, Sample
from gpurig.monitor.session import Run
from gpurig.strict.validate import printable


def _shown(text: object) -> Text:
    """A recorded host name or source as a cell: data, never markup, its control characters shown as escapes."""
    return Text(printable(text))


def _n(value, fmt="{:.0f}", none="-") -> str:
    return none if value is None else fmt.format(value)


def _util_cell(g: GpuSample) -> str:
    """Utilisation; under MIG, which NVML does not report it for, 'mig' on the GPU and GPM engine activity (marked *) on its devices."""
    if g.util_gpu is not None:
        return f"{g.util_gpu:.0f}%"
    if g.mig_mode and g.mig is None:
        return "mig"
    if g.mig is not None:
        return _n(g.gr_active, "{:.0%}*", "n/a" if g.gpm is False else "-")
    return "-"


def _jobs_cell(jobs: tuple[HpcJob, ...] | list[HpcJob]) -> str:
    """'42 alice' for the Slurm job holding a GPU, '42 alice +1' when another shares it; '' for none."""
    if not jobs:
        return ""
    first = f"{jobs[0].id} {printable(jobs[0].user)}" if jobs[0].user else jobs[0].id
    return first + (f" +{len(jobs) - 1}" if len(jobs) > 1 else "")


def _natural_width(headers: tuple[str, ...], rows: list[list], per_column: int, edge: int) -> int:
    """A table's width with every cell on one line: its widest cells plus ``per_column`` for each column's padding and rules."""
    widths = [max(cell_len(str(c)) for c in column) for column in zip(headers, *rows)]
    return sum(widths) + per_column * len(widths) + edge


Layout = tuple[tuple[str, ...], list[list], str | None]


def _with_jobs(headers: tuple[str, ...], rows: list[list], jobs: list[str], width: int, per_column: int, edge: int, give_way: tuple[str, ...] = ()) -> Layout:
    """The columns to show: a last one, job (Slurm job and user), where some GPU has a job and every row still fits ``width`` on one line.

    As report/tables.py does, the least important columns are left out first
    (``give_way``, when leaving them out makes room for the job) and what is left
    out is said under the table: (headers, rows, that line or None).
    """
    if not any(jobs):
        return headers, rows, None
    for n in range(len(give_way) + 1):
        keep = [i for i, h in enumerate(headers) if h not in give_way[:n]]
        shown = (*(headers[i] for i in keep), "job")
        cut = [[*(r[i] for i in keep), j] for r, j in zip(rows, jobs)]
        if _natural_width(shown, cut, per_column, edge) <= width:
            return shown, cut, f"not shown at {width} columns: {', '.join(give_way[:n])}" if n else None
    return headers, rows, f"not shown at {width} columns: job (the exporter's hpc_job and hpc_user labels, and --record, have it)"


def mig_lines(samples: dict[str, Sample]) -> list[str]:
    """What stands in for the utilisation NVML does not report under MIG, once per GPU in MIG mode."""
    lines = []
    for host in sorted(samples):
        gpus = samples[host].gpus
        for parent in (g for g in gpus if g.mig_mode and g.mig is None):
            devices = [g for g in gpus if g.mig is not None and g.index == parent.index]
            said = f"{printable(host)} GPU {parent.index}: MIG: whole-GPU utilisation not reported; "
            if any(g.gpm for g in devices):
                lines.append(said + "util* is GPM engine activity and sm GPM SM activity, per MIG device")
            else:
                lines.append(said + ("GPM not available on this GPU/driver: no activity figure" if devices else "no MIG device to measure"))
    return lines


def live_table(latest: dict[str, Sample], failed: dict[str, str] | None = None, width: int = 80) -> Table:
    """One row per GPU and MIG device (or per host without GPUs), in ``width`` columns: host, GPU, util, SM, memory, temp, power, CPU, RAM.

    Where Slurm jobs hold GPUs, a last column says which (when it fits).
    """
    caption = Text("\n".join(f"{printable(h)}: {why}" for h, why in sorted((failed or {}).items())), style="red")
    shown = {h: s for h, s in latest.items() if h not in (failed or {})}
    for line in mig_lines(shown):
        caption.append(("\n" if caption else "") + line, style="yellow")
    rows: list[list] = []
    jobs: list[str] = []
    for host in sorted(shown):
        s = latest[host]
        cpu = (f"{s.cpu_percent:.0f}%", f"{s.max_core:.0f}%", f"{s.mem_used / 2**30:.0f}/{s.mem_total / 2**30:.0f}G")
        if not s.gpus:
            rows.append([_shown(host[:14]), "-", "", "", "", "", "", *cpu])
            jobs.append("")
        for g in s.gpus:
            mem = f"{g.mem_used_mib / 1024:.0f}/{g.mem_total_mib / 1024:.0f}" if g.mem_used_mib is not None and g.mem_total_mib else "-"
            rows.append([
                _shown(host[:14]), g.label, _util_cell(g), _n(g.sm_active, "{:.0%}", "n/a" if g.gpm is False else "-"), mem,
                _n(g.temp_c), _n(g.power_w), *cpu,
            ])  # fmt: skip
            jobs.append(_jobs_cell(g.hpc_jobs))
    # box=None without edge padding: two spaces between columns.
    headers, rows, left_out = _with_jobs(("host", "gpu", "util", "sm", "mem GiB", "°C", "W", "cpu", "core", "ram"), rows, jobs, width, 2, -2)
    if left_out:
        caption.append(("\n" if caption else "") + left_out)
    table = Table(*headers, box=None, pad_edge=False, header_style="bold", caption=caption or None, caption_justify="left")
    for row in rows:
        table.add_row(*row)
    return table


def summary_table(run: Run, width: int = 80) -> Table:
    """Per host and GPU over the whole run: samples, mean utilisation and SM activity, peak memory, CPU; and the Slurm jobs seen, where they fit."""
    rows: list[list] = []
    jobs: list[str] = []
    for host in run.hosts():
        series = run.series(host)
        state = run.state(host)
        if not series:
            continue
        cpu = f"{mean(s.cpu_percent for s in series):.0f}%"
        core = f"{mean(s.max_core for s in series):.0f}%"
        keys = sorted({g.key for s in series for g in s.gpus})
        if not keys:
            rows.append([_shown(host), "-", str(len(series)), "", "", "", cpu, core, _shown(state.source)])
            jobs.append("")
        for key in keys:
            gs = [g for s in series for g in s.gpus if g.key == key]
            util = [g.util_gpu for g in gs if g.util_gpu is not None]
            engine = [g.gr_active for g in gs if g.gr_active is not None]
            sm = [g.sm_active for g in gs if g.sm_active is not None]
            mem = [g.mem_fraction for g in gs if g.mem_fraction is not None]
            shown = f"{mean(util):.0f}%" if util else f"{mean(engine):.0%}*" if engine else _util_cell(gs[-1])
            rows.append([
                _shown(host), gs[0].label, str(len(gs)), shown, f"{mean(sm):.0%}" if sm else "n/a" if gs[-1].gpm is False else "-",
                f"{max(mem):.0%}" if mem else "-", cpu, core, _shown(state.source),
            ])  # fmt: skip
            jobs.append(_jobs_cell(list(dict.fromkeys(job for g in gs for job in g.hpc_jobs))))  # every job seen, in order
    # rich's default box: a space each side of a cell and a rule after each column, plus the left edge. Which GPU source
    # (nvml, nvidia-smi) sampled a host matters less than whose job held its GPUs: it gives way first.
    headers, rows, left_out = _with_jobs(("host", "gpu", "n", "util", "sm", "mem peak", "cpu", "core", "source"), rows, jobs, width, 3, 1, ("source",))
    table = Table(*headers, header_style="bold")
    for row in rows:
        table.add_row(*row)
    lines = mig_lines({h: run.series(h)[-1] for h in run.hosts() if run.series(h)}) + ([left_out] if left_out else [])
    if lines:
        table.caption, table.caption_style, table.caption_justify = "\n".join(lines), "yellow", "left"
    return table


def findings_view(findings: list[Finding]) -> Group:
    """Each finding as three lines: what, the evidence, the fix."""
    if not findings:
        return Group(Text("diagnosis: nothing stands out", style="green"))
    parts = [Text("diagnosis:", style="bold")]
    for f in findings:
        parts.append(Text.assemble((f"[{f.rule}] ", "bold yellow"), printable(f"{f.where}: {f.title}")))
        parts.append(Text(printable(f"  evidence: {f.evidence}")))
        parts.append(Text(printable(f"  fix: {f.fix}"), style="cyan"))
    return Group(*parts)

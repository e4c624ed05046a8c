"""A PNG of a run: GPU utilisation, SM activity, GPU memory and CPU over time, one row of panels per host (matplotlib, Agg)."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402

from gpurig.files import write_output  # noqa: E402
from gpurig.monitor import MonitorError  # noqa: E402
from gpurig.monitor.session import Run  # noqa: E402

PANELS = ("GPU utilisation [%]", "SM activity [%]", "GPU memory [%]", "CPU [%]")


def plot(run: Run, path: str | Path) -> list[str]:
    """Draw the run into ``path`` (PNG, as ``gpurig.files.write_output`` writes); returns the panel titles, host by host."""
    hosts = [h for h in run.hosts() if run.series(h)]
    if not hosts:
        raise MonitorError("nothing to plot: the run has no samples", "monitor for longer, or check why no host answered")
    fig, axes = plt.subplots(len(hosts), len(PANELS), figsize=(4 * len(PANELS), 2.6 * len(hosts)), squeeze=False, sharex="row")
    titles = []
    try:
        for row, host in zip(axes, hosts):
            series = run.series(host)
            t0 = series[0].t
            xs = [s.t - t0 for s in series]
            indices = sorted({g.key for s in series for g in s.gpus})  # a GPU, then its MIG devices
            for ax, panel in zip(row, PANELS):
                ax.set_title(f"{host}: {panel}", fontsize=9)
                ax.set_ylim(0, 105)
                ax.grid(alpha=0.3)
                titles.append(ax.get_title())
            for index in indices:
                for ax, value in zip(row[:3], (_util, _sm, _mem)):
                    ys = [value(s, index) for s in series]
                    if any(y is not None for y in ys):
                        ax.plot(xs, [float("nan") if y is None else y for y in ys], label=_legend(index, value), linewidth=1)
            for ax in row[:3]:
                if not ax.lines:
                    ax.text(0.5, 0.5, "no data (no GPU or not reported)", ha="center", va="center", transform=ax.transAxes, fontsize=8)
                elif len(indices) > 1:
                    ax.legend(fontsize=6, loc="upper right")
            row[3].plot(xs, [s.cpu_percent for s in series], label="all cores", linewidth=1)
            row[3].plot(xs, [s.max_core for s in series], label="busiest core", linewidth=1)
            row[3].legend(fontsize=6, loc="upper right")
            for ax in row:
                ax.set_xlabel("seconds", fontsize=8)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        write_output(path, buf.getvalue(), "--plot")  # /dev/null is written to, never replaced
    finally:
        plt.close(fig)
    return titles


def _legend(key, value):
    """'GPU 0', or 'GPU 0:1' for a MIG device, whose utilisation line is GPM's engine activity and says so."""
    if key[1] < 0:
        return f"GPU {key[0]}"
    return f"GPU {key[0]}:{key[1]}" + (" (GPM engine)" if value is _util else "")


def _gpu(sample, key):
    return next((g for g in sample.gpus if g.key == key), None)


def _util(sample, index):
    """Utilisation; for a MIG device (NVML reports none under MIG) GPM's engine activity in its place."""
    g = _gpu(sample, index)
    if g is None:
        return None
    return g.util_gpu if g.util_gpu is not None or g.gr_active is None else 100 * g.gr_active


def _sm(sample, index):
    g = _gpu(sample, index)
    return 100 * g.sm_active if g and g.sm_active is not None else None


def _mem(sample, index):
    g = _gpu(sample, index)
    return 100 * g.mem_fraction if g and g.mem_fraction is not None else None

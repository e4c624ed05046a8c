"""GPU-hours over a window: allocated (a job's GPUs x its run time) and used (utilisation-weighted), per user, job and host.

Two sources, each read by its own reader. Allocated comes from the job
records the hosts' job agents (and Slurm's controller) keep, as JobViews:
a job's GPUs times the part of its run inside the window. Used comes from
monitor recordings (``gpurig monitor --record DIR``): each sample stands for
the time until the next one (at most ``GAP_FACTOR`` times the host's usual
interval: a longer gap is time nobody saw, counted as the usual interval),
and a GPU's ``util/100 x dt`` goes to whoever held it then: the Slurm jobs
the node maps to it, else the gpurig job whose devices name it and whose run
covers the instant, else the processes on it. Several holders share a
sample equally. A holder no job record covers (a process, a Slurm job whose
GPU count is not recorded) is allocated the time it held the GPU.

Idle allocations are the monitor's own rule (gpurig.monitor.idle: held, and
under 5%, one look per sample) run over the recording: a GPU that sat so
for longer than ``idle_after`` is listed with whoever held it.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from gpurig.errors import ConfigError, counted
from gpurig.jobs.views import JobView
from gpurig.monitor.idle import IdleTracker, utilisation
from gpurig.monitor.samples import GpuSample, Sample
from gpurig.monitor.session import Run
from gpurig.strict.validate import excerpt

GAP_FACTOR = 3.0  # a gap between samples longer than this many usual intervals is unseen time
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SPAN = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,6})?)([smhdw])")
MAX_SPAN = 3660 * 86400.0  # ten years


def parse_span(text: Any, flag: str) -> float:
    """Seconds from ``90m``, ``24h``, ``7d``, ``2w``, ``30s``; ConfigError with the fix otherwise."""
    value = str(text).strip().lower() if text is not None else ""
    m = _SPAN.fullmatch(value)
    seconds = float(m.group(1)) * UNITS[m.group(2)] if m else -1.0
    if not 0 < seconds <= MAX_SPAN:
        raise ConfigError(f"{flag} {excerpt(text)} is not a span of time",
                          f"give {flag} a number and a unit: 90m, 24h, 7d (s, m, h, d, w)")
    return seconds


def parse_since(text: Any, now: float) -> float:
    """The window's start (epoch seconds) from ``--since``: a span back from ``now`` (90m, 24h, 7d) or an ISO date or time
    (2026-01-31, 2026-01-31T08:00, UTC unless it names its offset)."""
    value = str(text).strip() if text is not None else ""
    if value[:1].isdigit() and "-" in value:
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            when = None
        if when is not None:
            start = (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()
            if start >= now:
                raise ConfigError(f"--since {excerpt(text)} is not in the past", "give a date before now, or a span such as 7d")
            return start
        raise ConfigError(f"--since {excerpt(text)} is not a date", "give an ISO date (2026-01-31, 2026-01-31T08:00) or a span: 90m, 24h, 7d")
    try:
        return now - parse_span(value, "--since")
    except ConfigError:
        raise ConfigError(f"--since {excerpt(text)} is neither a span nor a date",
                          "give a span (90m, 24h, 7d) or an ISO date (2026-01-31)") from None


@dataclass
class Usage:
    """One holder's GPU-seconds in the window: a job (gpurig's or Slurm's), or a process no job record covers."""

    user: str
    job: str
    host: str
    allocated_s: float = 0.0
    used_s: float = 0.0
    held_s: float = 0.0  # from the samples
    gpus: int | None = None  # the job record's GPU count (None: no record, or none said)
    recorded: bool = False  # a job record says its GPUs and run: allocated is that, not the held time

    @property
    def efficiency(self) -> float | None:
        return self.used_s / self.allocated_s if self.allocated_s > 0 else None


@dataclass
class IdleSpell:
    host: str
    gpu: str
    holders: str
    users: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class UsageReport:
    start: float
    end: float
    rows: list[Usage] = field(default_factory=list)
    idle: list[IdleSpell] = field(default_factory=list)
    samples: int = 0  # samples inside the window
    jobs: int = 0  # job records overlapping the window
    notes: list[str] = field(default_factory=list)

    def totals(self, key: str) -> list[Usage]:
        """The rows summed by ``user`` or ``host``."""
        out: dict[str, Usage] = {}
        for r in self.rows:
            name = getattr(r, key)
            t = out.setdefault(name, Usage(r.user if key == "user" else "*", "*", r.host if key == "host" else "*"))
            t.allocated_s += r.allocated_s
            t.used_s += r.used_s
            t.held_s += r.held_s
        return sorted(out.values(), key=lambda u: (-u.allocated_s, getattr(u, key)))


def job_gpus(view: JobView) -> int | None:
    """How many GPUs a job had: the devices it got, else the count it asked for; None when its record does not say."""
    if view.gpus:
        return len(view.gpus)
    count = (view.request or {}).get("count") if isinstance(view.request, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def usage(views: Iterable[JobView], runs: Sequence[Run], start: float, end: float, idle_after: float) -> UsageReport:
    """The window ``start``..``end``'s GPU-hours from job records and monitor recordings, and its idle allocations."""
    report = UsageReport(start, end)
    rows: dict[tuple[str, str, str], Usage] = {}
    slurm: dict[str, JobView] = {}
    agent: dict[str, list[JobView]] = {}
    for v in views:
        if v.started_at is None or _overlap(v.started_at, v.ended_at or end, start, end) <= 0:
            continue
        report.jobs += 1
        if v.mode == "slurm":
            slurm[v.id] = v
            host = str(v.raw.get("batch_host") or v.host)
        else:
            agent.setdefault(v.host, []).append(v)
            host = v.host
        gpus = job_gpus(v)
        row = rows.setdefault((v.user or "?", v.id, host), Usage(v.user or "?", v.id, host, gpus=gpus))
        if gpus is not None:
            row.recorded = True
            row.allocated_s += gpus * _overlap(v.started_at, v.ended_at or end, start, end)
    for host, series in _merged(runs).items():
        inside = [s for s in series if start <= s.t <= end]
        report.samples += len(inside)
        _sampled(host, inside, rows, slurm, agent.get(host, []), end)
        report.idle += idle_spells(host, inside, idle_after)
    for row in rows.values():
        if not row.recorded:
            row.allocated_s = row.held_s
    report.rows = sorted(rows.values(), key=lambda u: (u.user, u.host, u.job))
    no_count = sorted(r.job for r in rows.values() if not r.recorded and r.held_s == 0)
    if no_count:
        report.notes.append(f"no GPU count recorded and no samples for {counted(len(no_count), 'job')} ({', '.join(no_count[:8])}): "
                            "their allocation is not counted")
    return report


def _merged(runs: Sequence[Run]) -> dict[str, list[Sample]]:
    """Every recording's samples per host, in time order, one per instant (two recordings of one host may overlap)."""
    out: dict[str, dict[float, Sample]] = {}
    for run in runs:
        for host in run.hosts():
            for s in run.series(host):
                out.setdefault(host, {}).setdefault(s.t, s)
    return {h: [by_t[t] for t in sorted(by_t)] for h, by_t in out.items()}


def intervals(series: Sequence[Sample], end: float) -> list[float]:
    """The time each sample stands for: until the next, at most GAP_FACTOR usual intervals (then the usual one); the last, the usual."""
    gaps = [b.t - a.t for a, b in zip(series, series[1:]) if b.t > a.t]
    usual = statistics.median(gaps) if gaps else 1.0
    out = [(g if g <= GAP_FACTOR * usual else usual) for g in (b.t - a.t for a, b in zip(series, series[1:]))]
    if series:
        out.append(max(0.0, min(usual, end - series[-1].t)))
    return out


def _holders(g: GpuSample, t: float, slurm: dict[str, JobView], agent: list[JobView]) -> list[tuple[str, str]]:
    """(user, job) for whoever held GPU ``g`` at ``t``: its Slurm jobs, else the gpurig job given it, else its processes."""
    if g.hpc_jobs:
        return [(j.user or (slurm[j.id].user if j.id in slurm else "") or "?", j.id) for j in g.hpc_jobs]
    names = {g.label, str(g.index), *(x for x in (g.uuid,) if x)}
    for v in agent:
        if v.started_at is not None and v.started_at <= t <= (v.ended_at or float("inf")) and names & set(v.gpus):
            return [(v.user or "?", v.id)]
    return [(p.user or "?", f"pid {p.pid}" + (f" ({p.name})" if p.name else "")) for p in g.processes]


def _sampled(host: str, series: list[Sample], rows: dict[tuple[str, str, str], Usage], slurm: dict[str, JobView],
             agent: list[JobView], end: float) -> None:
    for s, dt in zip(series, intervals(series, end)):
        for g in s.gpus:
            if g.mig_mode:  # a MIG GPU's use is its MIG devices', each a GpuSample of its own
                continue
            holders = _holders(g, s.t, slurm, agent)
            if not holders:
                continue
            util = utilisation(g)
            share = dt / len(holders)
            for user, job in holders:
                row = rows.setdefault((user, job, host), Usage(user, job, host))
                row.held_s += share
                if util is not None:
                    row.used_s += util / 100.0 * share


def idle_spells(host: str, series: list[Sample], idle_after: float) -> list[IdleSpell]:
    """The held GPUs that sat idle (monitor.idle's rule) for longer than ``idle_after`` seconds, each with who held it."""
    tracker = IdleTracker()
    held: dict[str, tuple[str, str]] = {}
    out: list[IdleSpell] = []
    last = 0.0
    dts = intervals(series, float("inf"))
    for s, dt in zip(series, dts):
        before = tracker.of(host)
        tracker(host, {}, s)
        now_idle = tracker.of(host)
        for label, since in before.items():
            if label not in now_idle:
                out.append(IdleSpell(host, label, *held.pop(label, ("?", "?")), since, s.t))
        for g in s.gpus:
            if g.label in now_idle and now_idle[g.label] == s.t:
                held[g.label] = _holder_text(g)
        last = s.t + dt
    for label, since in tracker.of(host).items():
        out.append(IdleSpell(host, label, *held.pop(label, ("?", "?")), since, last))
    return sorted((x for x in out if x.seconds > idle_after), key=lambda x: (x.start, x.gpu))


def _holder_text(g: GpuSample) -> tuple[str, str]:
    if g.hpc_jobs:
        return ", ".join(f"slurm job {j.id}" for j in g.hpc_jobs), ", ".join(sorted({j.user or "?" for j in g.hpc_jobs}))
    return (", ".join(f"pid {p.pid}" + (f" ({p.name})" if p.name else "") for p in g.processes),
            ", ".join(sorted({p.user or "?" for p in g.processes})))

"""What the page shows, as JSON: the fleet table, the live series, the jobs and the history, each built from the library's own types.

Pure: the feeds hand in what they read (a facts FleetReport, the monitor's
Run, JobViews, a History) and get plain dicts back. A source that has not
answered, or could not be read, says ``unknown`` with why; nothing here
turns an absence into ``ok``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpurig.dashboard.history import History
from gpurig.facts import Facts
from gpurig.image.compat import CUDA_RELEASES, driver_supports, version_key
from gpurig.jobs.views import JobView
from gpurig.monitor.idle import IdleTracker, utilisation
from gpurig.monitor.samples import GpuSample, Sample
from gpurig.monitor.session import Run
from gpurig.results import FleetReport, HostResult
from gpurig.slurm.health import NodeState
from gpurig.status import Status

SCHEMA = "gpurig.dashboard/1"
IDLE_AFTER = 600.0  # seconds a held GPU may sit under 5% before the page flags it
POINTS = 60  # samples per series the page is sent when it opens (a minute at 1/s: 100 hosts x 8 GPUs is then about 2 MB)


def newest_cuda(driver: str | None) -> str | None:
    """The newest CUDA release (compat's table) whose images this driver runs with their full feature set."""
    if not driver:
        return None
    fits = [c.cuda for c in CUDA_RELEASES if driver_supports(driver, c.cuda)]
    return max(fits, key=version_key) if fits else None


def unknown(why: str) -> dict[str, Any]:
    return {"state": "unknown", "why": why}


# --- fleet ---------------------------------------------------------------------------------------------------------------------


def fleet_rows(hosts: Sequence[str], facts: FleetReport | None, facts_why: str, verdicts: Mapping[str, dict[str, Any]],
               verdicts_why: str, live_failed: Mapping[str, str], extra: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per selected host: reachability and what it is (from facts), its last verify verdict, and its live sampler's state;
    ``extra``: more cells per host (its Slurm node's state, its provision drift), added as they are."""
    results = {r.host: r for r in facts.results} if facts is not None else {}
    rows = [_fleet_row(h, results.get(h), facts_why, verdicts.get(h), verdicts_why, live_failed.get(h)) for h in hosts]
    for row in rows:
        row.update((extra or {}).get(row["host"], {}))
    return rows


def slurm_cell(result: HostResult | None, why: str, read_at: float | None = None) -> dict[str, Any]:
    """A Slurm node's state as its controller has it (sinfo on the node, as ``gpurig verify`` reads it): the state, whether Slurm
    gives it jobs, the drain/down reason and since when; unknown with why where it was not read."""
    if result is None:
        return unknown(why or "the node's Slurm state has not been read yet")
    if not isinstance(result.data, NodeState):
        return unknown(f"the node's Slurm state could not be read: {result.reason or result.status}")
    n = result.data
    return {"state": "known", "node": n.state, "responding": n.responding, "schedules": n.healthy,
            "reason": "" if n.reason == "none" else n.reason, "since": n.since, "read_at": read_at}


def _fleet_row(host: str, result: HostResult | None, facts_why: str, verdict: dict[str, Any] | None, verdicts_why: str,
               live_failed: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {"host": host}
    if result is None:
        row.update(reach="unknown", reason=facts_why or "facts not read yet")
    elif not isinstance(result.data, Facts):
        row.update(reach=str(result.status), reason=result.reason, fix=result.fix)
    else:
        f = result.data
        row.update(
            reach=str(Status.OK),
            os=f"{f.os.id or '?'} {f.os.version_id or ''}".strip(),
            kernel=f.kernel,
            driver=f.driver_version,
            cuda=newest_cuda(f.driver_version),
            gpus=[g.name for g in f.gpus],
            gpu_note="" if f.gpus or not f.pci_gpus else f"{len(f.pci_gpus)} on PCI, no driver",
            docker=f.docker.server_version or ("stopped" if f.docker.installed else None),
            cpus=f.cpus,
            mem_bytes=f.mem_total_bytes,
        )
    if verdict is not None:
        row["verify"] = {"state": "known", **verdict}
    else:
        row["verify"] = unknown(verdicts_why or "no verify result recorded for this host (gpurig records every verify run and rollout in the project)")
    row["sampler"] = {"state": "failed", "why": live_failed} if live_failed else {"state": "running"}
    return row


# --- live ----------------------------------------------------------------------------------------------------------------------


def _r(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _pct(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else round(100.0 * part / whole, 1)


def _gpu_point(t: float, g: GpuSample) -> list[float | None]:
    """[t, utilisation %, memory used %, temperature C, power W, SM activity %]; None where the GPU does not say."""
    return [round(t, 3), _r(utilisation(g)), _pct(g.mem_used_mib, g.mem_total_mib), _r(g.temp_c), _r(g.power_w),
            None if g.sm_active is None else round(100.0 * g.sm_active, 1)]


def _gpu_now(g: GpuSample, idle_since: float | None) -> dict[str, Any]:
    return {
        "idle_since": idle_since,
        "name": g.name,
        "uuid": g.uuid,
        "mem_total_mib": _r(g.mem_total_mib, 0),
        "power_limit_w": _r(g.power_limit_w, 0),
        "processes": [{"pid": p.pid, "user": p.user, "name": p.name, "used_mib": p.used_mib} for p in g.processes],
        "jobs": [{"id": j.id, "user": j.user} for j in g.hpc_jobs],
    }


def host_series(samples: Iterable[Sample], before: Sample | None = None, idle: Mapping[str, float] | None = None) -> dict[str, Any]:
    """One host's samples as compact series: host points [t, cpu %, memory used %] and, per GPU label, its points and, where
    they changed since ``before`` (the sample the page already has), its name, memory size and holders (processes, Slurm
    jobs) and since when it has sat idle while held (``idle``: IdleTracker.of); ``last_t``, the newest sample's time unrounded,
    is where the next delta starts."""
    points: list[list[float | None]] = []
    gpus: dict[str, dict[str, Any]] = {}
    idle = idle or {}
    had = {g.label: _gpu_now(g, idle.get(g.label)) for g in before.gpus} if before is not None else {}
    last_t = None
    for s in samples:
        last_t = s.t
        points.append([round(s.t, 3), _r(s.cpu_percent), _pct(s.mem_used, s.mem_total)])
        for g in s.gpus:
            entry = gpus.setdefault(g.label, {"points": []})
            entry["points"].append(_gpu_point(s.t, g))
            now = _gpu_now(g, idle.get(g.label))
            if had.get(g.label) != now:
                entry.update(now)
                had[g.label] = now
    return {"points": points, "gpus": gpus, "last_t": last_t}


def live_section(run: Run, state: str, why: str, interval: float, failed: Mapping[str, str], after: Mapping[str, float] | None = None,
                 points: int = POINTS, idle: IdleTracker | None = None, idle_after: float = IDLE_AFTER) -> dict[str, Any]:
    """The live section: every host the session has heard from, with its last ``points`` samples (or only those after ``after``);
    a held GPU idle for ``idle_after`` seconds is flagged on the page, naming what holds it."""
    hosts: dict[str, Any] = {}
    for host in run.hosts():
        st = run.state(host)
        before = None
        if after is None:
            series = run.recent(host, limit=points)
        else:
            series = run.recent(host, after=after.get(host))
            earlier = run.recent(host, limit=len(series) + 1) if host in after else []
            before = earlier[0] if len(earlier) > len(series) else None
        found = host_series(series, before, idle.of(host) if idle is not None else None)
        found.update(source=st.source, notes=list(st.notes), failed=failed.get(host))
        if st.hello.get("cpus"):
            found["cpus"] = st.hello.get("cpus")
        hosts[host] = found
    return {"state": state, "why": why, "interval": interval, "idle_after": idle_after, "hosts": hosts}


def cursor_of(live: Mapping[str, Any], before: Mapping[str, float] | None = None) -> dict[str, float]:
    """Each host's newest time in a live section (where it had none, the one before): where the next delta starts."""
    cursor = dict(before or {})
    for host, found in live["hosts"].items():
        if found["last_t"] is not None:
            cursor[host] = found["last_t"]
    return cursor


# --- jobs ----------------------------------------------------------------------------------------------------------------------


def job_row(v: JobView) -> dict[str, Any]:
    return {
        "host": v.host, "id": v.id, "name": v.name, "state": v.state, "state_text": v.state_text, "exit_code": v.exit_code,
        "gpus": v.gpu_text, "runtime_s": _r(v.runtime_s, 0), "submitted_at": v.submitted_at, "started_at": v.started_at,
        "ended_at": v.ended_at, "command": " ".join(v.argv), "image": v.image, "container": v.container,
        "scheduler": "slurm" if v.id.isdecimal() else "gpurig",
    }


def jobs_section(report: FleetReport | None, views: Sequence[JobView], why: str, read_at: float | None) -> dict[str, Any]:
    """The jobs the hosts' agents (and Slurm's controller) told of, newest first, and the hosts that could not be asked, with why."""
    if report is None:
        return {**unknown(why or "the job queue has not been read yet"), "jobs": [], "unread": []}
    rows = [job_row(v) for v in sorted(views, key=lambda v: (v.submitted_at or 0, v.host, v.id), reverse=True)]
    unread = [{"host": r.host, "status": str(r.status), "why": r.reason} for r in report.results if r.status not in (Status.OK, Status.CHANGED)]
    return {"state": "partial" if unread else "known", "why": why, "read_at": read_at, "jobs": rows, "unread": unread}


# --- history -------------------------------------------------------------------------------------------------------------------


def history_section(found: History | None, why: str) -> dict[str, Any]:
    if found is None:
        return {**unknown(why or "the records have not been read yet"), "entries": [], "unread": []}
    return {"state": "partial" if found.unread else "known", "why": why, "entries": found.entries, "unread": found.unread,
            "rollout_files": found.rollout_files, "build_files": found.build_files,
            "verify_files": found.verify_files, "action_files": found.action_files, "idle_stop_files": found.idle_stop_files}


def document(**sections: Any) -> dict[str, Any]:
    return {"schema": SCHEMA, "now": time.time(), **sections}

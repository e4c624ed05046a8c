"""What the page shows, as JSON: the fleet table, the live series, the jobs and the history, each built from the library's own types.

Pure: the feeds hand in what they read (a facts FleetReport, the monitor's
Run and its trackers, the containers' names, JobViews, a History) and get plain dicts back. A source that has not
answered, or could not be read, says ``unknown`` with why; nothing here
turns an absence into ``ok``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpurig.dashboard.containernames import RUNNING, ContainerNames, HostBook
from gpurig.dashboard.history import History
from gpurig.facts import Facts
from gpurig.image.compat import CUDA_RELEASES, driver_supports, version_key
from gpurig.jobs.views import JobView
from gpurig.monitor.holders import Held, HolderTracker, holder_keys
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


def _who(users: Iterable[str | None]) -> str:
    named = list(dict.fromkeys(u for u in users if u))
    return f" ({', '.join(named)})" if named else ""


def _stop_refusal(cid: str, book: HostBook | None) -> str:
    """Why the page offers no stop for container ``cid`` (empty: it may be stopped, with --allow-actions)."""
    known = book.known.get(cid) if book is not None else None
    if known is None:
        if book is not None and book.why:
            return f"the host's Docker engine could not be asked: {book.why}"
        if book is not None and cid in book.missing:
            return "the host's Docker engine does not know this container (another engine's?): gpurig stops only what deploy made"
        return "its name has not been read from the host's Docker engine yet"
    if known.job:
        return f"the container of gpurig job {known.job}: cancel the job in Jobs"
    if not known.deployed:
        return "not deployed by gpurig (it has no io.gpurig.deploy labels): stop it where it was started"
    if known.status != RUNNING:
        return f"not running ({known.status})"
    return ""


def holders_of(g: GpuSample, held: Mapping[str, Held] | None = None, book: HostBook | None = None) -> list[dict[str, Any]]:
    """Who holds ``g``, for the page: each Slurm job, each container (its processes together: its name from the host's engine,
    the processes' users) and each process in no container, with since when (the samples' clock: ``since``, and ``known``
    False where it held the GPU already when the samples began; None where the samples never saw it begin) and, for a
    container, whether the page may stop it and why not."""
    held = held or {}
    out: list[dict[str, Any]] = []

    def add(key: str, text: str, **more: Any) -> None:
        h = held.get(key)
        out.append({"key": key, "text": text, "since": None if h is None else round(h.since, 3), "known": None if h is None else h.known,
                    **more})

    for j in g.hpc_jobs:
        add(f"job:{j.id}", f"slurm job {j.id}{_who([j.user])}", kind="job", job=j.id)
    for key in holder_keys(g):
        kind, _, rest = key.partition(":")
        if kind == "container":
            procs = [p for p in g.processes if p.container == rest]
            known = book.known.get(rest) if book is not None else None
            name = (f"job {known.job}" if known.job else known.name) if known is not None else f"container {rest[:12]}"
            mib = [p.used_mib for p in procs if p.used_mib is not None]
            add(key, name + _who(p.user for p in procs), kind="container", id=rest, name=known.name if known else None,
                image=known.image if known else None, deployed=known.deployed if known else None, user=known.user if known else None,
                used_mib=sum(mib) if mib else None, pids=[p.pid for p in procs], no_stop=_stop_refusal(rest, book))
        elif kind == "pid":
            p = next(p for p in g.processes if not p.container and key == f"pid:{p.pid}:{p.name or ''}")
            add(key, f"{p.name or f'pid {p.pid}'}{_who([p.user])}", kind="process", pid=p.pid, used_mib=p.used_mib)
    return out


def _gpu_now(g: GpuSample, idle_since: float | None, held: Mapping[str, Held] | None = None, book: HostBook | None = None) -> dict[str, Any]:
    return {
        "idle_since": idle_since,
        "name": g.name,
        "uuid": g.uuid,
        "mem_total_mib": _r(g.mem_total_mib, 0),
        "power_limit_w": _r(g.power_limit_w, 0),
        "processes": [{"pid": p.pid, "user": p.user, "name": p.name, "used_mib": p.used_mib, **({"container": p.container} if p.container else {})}
                      for p in g.processes],
        "jobs": [{"id": j.id, "user": j.user} for j in g.hpc_jobs],
        "holders": holders_of(g, held, book),
    }


def _as_of(t: float, idle: Mapping[str, float], held: Mapping[str, Mapping[str, Held]]) -> tuple[dict[str, float], dict[str, dict[str, Held]]]:
    """What the trackers said when the sample at ``t`` was the newest: a streak or a holding that began after ``t`` was not there."""
    return ({label: since for label, since in idle.items() if since <= t},
            {label: {k: h for k, h in hs.items() if h.since <= t} for label, hs in held.items()})


def host_series(samples: Iterable[Sample], before: Sample | None = None, idle: Mapping[str, float] | None = None,
                held: Mapping[str, Mapping[str, Held]] | None = None, book: HostBook | None = None) -> dict[str, Any]:
    """One host's samples as compact series: host points [t, cpu %, memory used %] and, per GPU label, its points and, where
    they changed since ``before`` (the sample the page already has), its name, memory size, holders (``holders_of``: Slurm jobs,
    containers named from ``book``, processes, each since when ``held`` says) and since when it has sat idle while held
    (``idle``: IdleTracker.of); ``last_t``, the newest sample's time unrounded, is where the next delta starts."""
    points: list[list[float | None]] = []
    gpus: dict[str, dict[str, Any]] = {}
    idle, held = idle or {}, held or {}
    had: dict[str, dict[str, Any]] = {}
    if before is not None and not (book is not None and book.changed_t is not None and book.changed_t >= before.t):
        idle_then, held_then = _as_of(before.t, idle, held)  # as the page was sent it, not as the trackers say now
        had = {g.label: _gpu_now(g, idle_then.get(g.label), held_then.get(g.label), book) for g in before.gpus}
    last_t = None
    for s in samples:
        last_t = s.t
        points.append([round(s.t, 3), _r(s.cpu_percent), _pct(s.mem_used, s.mem_total)])
        for g in s.gpus:
            entry = gpus.setdefault(g.label, {"points": []})
            entry["points"].append(_gpu_point(s.t, g))
            now = _gpu_now(g, idle.get(g.label), held.get(g.label), book)
            if had.get(g.label) != now:
                entry.update(now)
                had[g.label] = now
    return {"points": points, "gpus": gpus, "last_t": last_t}


def live_section(run: Run, state: str, why: str, interval: float, failed: Mapping[str, str], after: Mapping[str, float] | None = None,
                 points: int = POINTS, idle: IdleTracker | None = None, idle_after: float = IDLE_AFTER, held: HolderTracker | None = None,
                 names: ContainerNames | None = None) -> dict[str, Any]:
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
        found = host_series(series, before, idle.of(host) if idle is not None else None, held.of(host) if held is not None else None,
                            names.book(host) if names is not None else None)
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

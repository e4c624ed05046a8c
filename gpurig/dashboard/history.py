"""What gpurig already keeps on disk, as the dashboard's History and each host's last verify verdict.

Rollouts' state files (``.gpurig/rollouts/*.json``, gpurig.deploy.rollplan:
per host what it runs, whether verify passed, at which level, when, why not)
build reports (``reports/builds/*/*.json``, gpurig.image.build: what was
built, when, and the promotions appended to them), the verify history
(``.gpurig/history/verify.jsonl``, gpurig.verify.verdictlog: every
``gpurig verify`` run, per host), the actions taken from a dashboard
(``.gpurig/history/actions.jsonl``, gpurig.dashboard.actions: a job
cancelled or a container stopped from the page) and the idle stops (``.gpurig/history/idle-stop.jsonl``,
gpurig.monitor.idlestop: each container the monitor stopped for its idle
GPUs). A host's last verdict is the newest of its
verify runs and its rollouts' verify gates. Each file is read by the
same reader its writer's other readers use; a file that cannot be read is
named with why, never passed over as if there were nothing to say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpurig.dashboard.actions import ACTIONS_LOG, read_actions
from gpurig.deploy.rollplan import STATE_DIR, read_state
from gpurig.errors import GpurigError
from gpurig.flows.imagebuild import REPORTS_DIR
from gpurig.image.build import read_report
from gpurig.monitor.idlestop import IDLE_STOP_LOG, read_idle_stops
from gpurig.verify.verdictlog import FLEET, VERIFY_LOG, read_verify_history

# The newest entries the page lists; the rest stay in the files.
MAX_ENTRIES = 200


@dataclass
class History:
    """Entries newest first, each host's last verify verdict, and the files that could not be read (path, why)."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    unread: list[dict[str, str]] = field(default_factory=list)
    rollout_files: int = 0
    build_files: int = 0
    verify_files: int = 0
    action_files: int = 0
    idle_stop_files: int = 0


def read_history(root: Path) -> History:
    """Every rollout state, build report, verify run and dashboard action under the project ``root``."""
    found = History()
    rollouts = sorted((root / STATE_DIR).glob("*.json"))
    found.rollout_files = len(rollouts)
    for path in rollouts:
        try:
            hosts = read_state(path, "remove it, or run the rollout again") or {}
        except GpurigError as err:
            found.unread.append({"path": str(path), "why": err.problem})
            continue
        for entry in hosts.values():
            found.entries.append(_rollout_entry(path, entry))
    builds = sorted((root / REPORTS_DIR / "builds").glob("*/*.json"))
    found.build_files = len(builds)
    for path in builds:
        try:
            report = read_report(path)
        except GpurigError as err:
            found.unread.append({"path": str(path), "why": err.problem})
            continue
        if not isinstance(report, dict):
            found.unread.append({"path": str(path), "why": "not a build report (not a mapping)"})
            continue
        found.entries += _build_entries(report)
    verified = read_verify_history(root)
    found.verify_files = verified.files
    found.unread += verified.unread
    found.entries += [_verify_entry(e) for e in verified.entries]
    acted = read_actions(root)
    found.action_files = acted.files
    found.unread += acted.unread
    found.entries += [_action_entry(e) for e in acted.entries]
    stops, unread, found.idle_stop_files = read_idle_stops(root)
    found.unread += unread
    found.entries += [_idle_stop_entry(e) for e in stops]
    found.verdicts = last_verdicts(found.entries)
    found.entries.sort(key=lambda e: e.get("time") or "", reverse=True)
    del found.entries[MAX_ENTRIES:]
    return found


def _rollout_entry(path: Path, entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "rollout",
        "time": entry.get("time") or "",
        "host": entry.get("host") or "",
        "state": entry.get("state") or "",
        "verify": entry.get("verify") or "not run",
        "level": entry.get("level") or "",
        "image": entry.get("image_ref") or "",
        "reason": entry.get("reason") or "",
        "file": path.name,
    }


def _verify_entry(entry: dict[str, Any]) -> dict[str, Any]:
    kept = entry.get("records")
    records = kept if isinstance(kept, list) else []
    first = next((r for r in records if isinstance(r, dict) and r.get("status") == "fail"), None)
    reason = f"{first.get('id')}: {first.get('detail')}" if first else _text(entry.get("reason"))
    named = entry.get("hosts")
    hosts = named if entry["host"] == FLEET and isinstance(named, list) else None
    return {
        "kind": "verify",
        "time": entry["time"],
        "host": entry["host"] if hosts is None else "",
        "hosts": [str(h) for h in hosts] if hosts is not None else None,
        "worst": entry["worst"],
        "verify": "passed" if entry.get("passed") is True else "failed",
        "level": _text(entry.get("level")),
        "image": _text(entry.get("target")),
        "reason": reason,
        "fix": _text(first.get("fix")) if first else _text(entry.get("fix")),
        "figures": _text(entry.get("figures")),
        "file": Path(VERIFY_LOG).name,
    }


def _action_entry(entry: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "action", "time": entry["time"], "action": entry["action"], "job": _text(entry.get("job")),
            "host": _text(entry.get("host")), "result": _text(entry.get("result")), "detail": _text(entry.get("detail")),
            "client": _text(entry.get("client")), "container": _text(entry.get("container")), "file": Path(ACTIONS_LOG).name}


def _idle_stop_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A container the monitor stopped (or tried to) for its idle GPUs (gpurig.monitor.idlestop)."""
    gpus = entry.get("gpus")
    return {
        "kind": "idle-stop",
        "time": entry["time"],
        "host": entry["host"],
        "container": _text(entry.get("container")),
        "user": _text(entry.get("user")),
        "image": _text(entry.get("image")),
        "gpus": [str(g) for g in gpus] if isinstance(gpus, list) else [],
        "idle_s": entry.get("idle_s") if isinstance(entry.get("idle_s"), (int, float)) else None,
        "idle_stop_s": entry.get("idle_stop_s") if isinstance(entry.get("idle_stop_s"), (int, float)) else None,
        "stopped": entry.get("stopped") is True,
        "reason": _text(entry.get("reason")),
        "file": Path(IDLE_STOP_LOG).name,
    }


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _build_entries(report: dict[str, Any]) -> list[dict[str, Any]]:
    image = _text(report.get("image"))
    out = [{
        "kind": "build",
        "time": _text(report.get("built_at")),
        "image": image,
        "variant": _text(report.get("variant")),
        "torch": _text(report.get("torch")),
        "cuda": _text(report.get("cuda")),
        "image_id": _text(report.get("image_id"))[:19],
        "duration_s": report.get("duration_s") if isinstance(report.get("duration_s"), (int, float)) else None,
    }]
    promotions = report.get("promotions")
    for p in promotions if isinstance(promotions, list) else ():
        if isinstance(p, dict):
            proved = p.get("verified_on")
            out.append({
                "kind": "promotion",
                "time": _text(p.get("at")),
                "image": image,
                "alias": _text(p.get("alias")),
                "hosts": len(proved) if isinstance(proved, list) else 0,
                "pushed": _text(p.get("pushed_digest")),
            })
    return out


def last_verdicts(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each host's newest verify, from a rollout's gate or a ``gpurig verify`` run (passed or failed): its verdict, level, time,
    image and why not."""
    latest: dict[str, dict[str, Any]] = {}
    for e in entries:
        if e["kind"] not in ("rollout", "verify") or e["verify"] not in ("passed", "failed") or not e["host"]:
            continue
        if e["host"] not in latest or e["time"] > latest[e["host"]]["time"]:
            source = f"rollout {e['file']}" if e["kind"] == "rollout" else f"verify run ({e['file']})"
            latest[e["host"]] = {"verdict": e["verify"], "level": e["level"], "time": e["time"], "image": e["image"],
                                 "reason": e["reason"], "source": source}
    return latest

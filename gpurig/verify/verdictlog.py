"""Every verify run kept in the project: one JSON line per host (or one for the fleet's fabric) in ``.gpurig/history/verify.jsonl``.

Beside the rollouts' state (``.gpurig/rollouts``), under the project root. A
line holds when, which host (or ``FLEET`` with ``hosts``), the level, the
target, the worst status, the records that failed or warned with their fixes,
the key figures and gpurig's version: what the records say, never the
environment, a token or a key. Each line is one ``write`` to a file opened
with O_APPEND, so two runs appending at once never interleave within a line;
a run killed mid-write leaves a torn line, which the next run ends with a
newline and the reader skips. The
file is bounded: past ``MAX_BYTES`` it becomes ``verify.jsonl.1`` (the one
before is dropped) and a new file starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpurig import __version__
from gpurig.files import append_jsonl, read_jsonl
from gpurig.verify.records import HostVerdict, Record

HISTORY_DIR = ".gpurig/history"
VERIFY_LOG = f"{HISTORY_DIR}/verify.jsonl"
SCHEMA = "gpurig.verify-history/1"
FLEET = "*fabric*"  # the host of an entry for the whole fleet (a fabric run), which names its hosts in ``hosts``
MAX_BYTES = 4 * 2**20  # one file; with the rotated one, at most twice this on disk
MAX_LINE = 64 * 2**10  # a line is a few hundred bytes; one over this is not gpurig's
MAX_RECORDS = 40  # failing/warning records kept per line
MAX_TEXT = 400  # characters kept of a record's detail, fix and measured values


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _short(value: Any) -> Any:
    """A record's value as kept: text and lists cut to MAX_TEXT, numbers and None as they are."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def record_entry(r: Record) -> dict[str, Any]:
    return {"id": r.id, "probe": r.probe, "status": r.status, "measured": _short(r.measured), "expected": _short(r.expected),
            "unit": r.unit, "detail": _short(r.detail), "fix": _short(r.fix)}


def verdict_entry(verdict: HostVerdict, *, time: str | None = None) -> dict[str, Any]:
    """One host's verify run as a history line: worst status, the failing and warning records with their fixes, the figures."""
    bad = [r for r in verdict.records if r.status in ("fail", "warn")]
    return {"schema": SCHEMA, "time": time or now(), "host": verdict.host, "level": verdict.level, "target": verdict.target or None,
            "worst": verdict.worst, "passed": verdict.passed, "records": [record_entry(r) for r in bad[:MAX_RECORDS]],
            "more_records": max(0, len(bad) - MAX_RECORDS), "figures": verdict.figures(), "gpurig": __version__}


def unverified_entry(host: str, level: str, target: str, status: str, reason: str, fix: str = "", *, time: str | None = None) -> dict[str, Any]:
    """A host verify could not check (unreachable, the run failed before any record): its status and why, never a pass."""
    return {"schema": SCHEMA, "time": time or now(), "host": host, "level": level, "target": target or None, "worst": status,
            "passed": False, "records": [], "more_records": 0, "figures": "", "reason": _short(reason), "fix": _short(fix),
            "gpurig": __version__}


def fleet_entry(hosts: Sequence[str], level: str, records: Sequence[Record], *, target: str = "", figures: str = "",
                time: str | None = None) -> dict[str, Any]:
    """A check of the fleet as a whole (``verify --level fabric``: one all-reduce over these hosts) as one line naming its hosts."""
    verdict = HostVerdict(FLEET, tuple(records), level, target)
    return {**verdict_entry(verdict, time=time), "hosts": list(hosts), "figures": figures or verdict.figures(),
            "passed": bool(records) and not verdict.failures and any(r.status != "skip" for r in records)}


def append_entries(root: Path, entries: Iterable[dict[str, Any]]) -> Path:
    """Append each entry as one line (one write each, O_APPEND), rotating the file first when it has grown past MAX_BYTES."""
    return append_lines(Path(root) / VERIFY_LOG, entries,
                        shrink=lambda entry: {**entry, "records": [], "more_records": len(entry.get("records") or ())})


def append_lines(path: Path, entries: Iterable[dict[str, Any]], shrink: Callable[[dict[str, Any]], dict[str, Any]] = dict) -> Path:
    """Any history of the project kept as this one is (the dashboard's actions too): each entry one line, one write, O_APPEND,
    the file rotated past MAX_BYTES; a line over MAX_LINE is written as ``shrink(entry)`` (what it can lose), cut to the bound
    (gpurig.files.append_jsonl, which the monitor's idle stops use too)."""
    return append_jsonl(path, entries, max_bytes=MAX_BYTES, max_line=MAX_LINE, shrink=shrink)


@dataclass
class VerifyHistory:
    """The entries read, oldest first, and the files that could not be read (path, why)."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    unread: list[dict[str, str]] = field(default_factory=list)
    files: int = 0


def read_verify_history(root: Path, host: str | None = None, since: str | None = None) -> VerifyHistory:
    """The verify history under ``root`` (the rotated file first): every entry, or ``host``'s (a fleet entry naming it counts),
    from ``since`` (an ISO time) on. A torn or foreign line is skipped; a file that cannot be read is named with why."""
    return read_lines(Path(root) / VERIFY_LOG, lambda entry: _is_verify(entry) and _wanted(entry, host, since))


def read_lines(base: Path, accept: Callable[[dict[str, Any]], bool]) -> VerifyHistory:
    """A history kept by ``append_lines`` (its rotated file first): the lines that are JSON objects ``accept`` takes."""
    lines, unread, files = read_jsonl(base, max_bytes=MAX_BYTES, max_line=MAX_LINE)
    return VerifyHistory([e for e in lines if accept(e)], unread, files)


def _is_verify(entry: dict[str, Any]) -> bool:
    """Whether a line is a verify run's: its schema, and the fields every reader relies on."""
    return (entry.get("schema") == SCHEMA and isinstance(entry.get("host"), str) and isinstance(entry.get("time"), str)
            and isinstance(entry.get("worst"), str))


def _wanted(entry: dict[str, Any], host: str | None, since: str | None) -> bool:
    if since is not None and entry["time"] < since:
        return False
    hosts = entry.get("hosts")
    return host is None or entry["host"] == host or (isinstance(hosts, list) and host in hosts)

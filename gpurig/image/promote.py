"""Promotion: an alias (``stable``) moves to an image only when enough hosts proved it, and the build report keeps the proof.

The proof is what rollouts recorded (gpurig/deploy/rollplan.py: a host whose
verify passed on the image id, its level and time); a promotion names those
hosts in the image's build report (``promotions``), beside the build that
made it, so "who said this image is good, when" has one answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpurig.errors import SpecError
from gpurig.image.build import build_reports, read_report, write_json_atomic


class PromotionRefused(SpecError):
    """Too few hosts proved the image, or nothing records its build: nothing was tagged."""


@dataclass(frozen=True)
class Proof:
    """The hosts whose verify passed on one image id (one entry per host: its latest pass)."""

    image_id: str
    hosts: tuple[dict[str, Any], ...]

    @property
    def names(self) -> list[str]:
        return [str(h.get("host")) for h in self.hosts]


def proof(image_id: str, passed: Sequence[dict[str, Any]]) -> Proof:
    """One entry per host (its latest pass on ``image_id``), in host order."""
    latest: dict[str, dict[str, Any]] = {}
    for entry in passed:
        name = str(entry.get("host"))
        if name not in latest or str(entry.get("time", "")) > str(latest[name].get("time", "")):
            latest[name] = entry
    return Proof(image_id, tuple(latest[n] for n in sorted(latest)))


def check_enough(ref: str, found: Proof, min_hosts: int, rollout_hint: str) -> None:
    """PromotionRefused unless at least ``min_hosts`` hosts passed verify on the image."""
    if min_hosts < 1:
        raise PromotionRefused(f"--min-hosts {min_hosts}: a promotion needs at least one host's proof", "give --min-hosts 1 or more")
    if len(found.hosts) >= min_hosts:
        return
    said = f"on {len(found.hosts)} host{'' if len(found.hosts) == 1 else 's'}" + (f" ({', '.join(found.names)})" if found.hosts else "")
    raise PromotionRefused(
        f"{ref} ({found.image_id[:19]}) passed verify {said}; --min-hosts {min_hosts} asks for {min_hosts}",
        f"roll it out to more hosts first ({rollout_hint}), or lower --min-hosts",
    )


def find_report(reports_dir: Path, image_id: str) -> Path | None:
    """The build report of the image with this id, newest first where several builds made the same image."""
    found = [(str(report.get("built_at", "")), path) for path, report in build_reports(reports_dir) if report.get("image_id") == image_id]
    return max(found)[1] if found else None


def record(report_path: Path, alias_ref: str, found: Proof, min_hosts: int, pushed: str) -> dict[str, Any]:
    """Append this promotion to the build report (atomically): the alias, when, and each proving host's result."""
    report = read_report(report_path)
    if not isinstance(report, dict) or not isinstance(report.get("promotions", []), list):
        raise PromotionRefused(f"the build report {report_path} is not one gpurig wrote (a mapping, its promotions a list)",
                               "build the image again to write a new report")
    entry = {
        "alias": alias_ref,
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "min_hosts": min_hosts,
        "verified_on": [{k: h.get(k) for k in ("host", "level", "time", "verify")} for h in found.hosts],
        "pushed_digest": pushed or None,
    }
    report["promotions"] = [*report.get("promotions", []), entry]
    write_json_atomic(report_path, report)
    return entry

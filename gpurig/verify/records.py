"""The records probes emit and one host's verdict built from them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

STATUSES = ("pass", "warn", "fail", "skip")
STATUS_ORDER = {"skip": 0, "pass": 1, "warn": 2, "fail": 3}
# The key figures a fleet row shows: record id -> short label.
FIGURES = (("matmul.bf16", "bf16"), ("matmul.tf32", "tf32"), ("membw", "mem"), ("nccl.allreduce", "nccl"), ("training", "train"), ("fabric.busbw", "busbw"))


@dataclass(frozen=True)
class Record:
    """One probe record: {id, status, measured, expected, unit, detail, fix}, and the probe that made it."""

    probe: str  # host | toolkit | container
    id: str
    status: str
    measured: Any = None
    expected: Any = None
    unit: str = ""
    detail: str = ""
    fix: str = ""

    @classmethod
    def from_probe(cls, probe: str, raw: Mapping[str, Any]) -> Record:
        """A record as a probe printed it; an unknown status or a missing id is the probe's failure, said as such."""
        rid = str(raw.get("id") or "?")
        status = raw.get("status")
        if status not in STATUSES:
            return cls(probe, rid, "fail", detail=f"the {probe} probe gave status {status!r}", fix="update checks/ on this machine")
        return cls(probe, rid, status, raw.get("measured"), raw.get("expected"), str(raw.get("unit") or ""),
                   str(raw.get("detail") or ""), str(raw.get("fix") or ""))

    def to_dict(self) -> dict[str, Any]:
        return {"probe": self.probe, "id": self.id, "status": self.status, "measured": self.measured,
                "expected": self.expected, "unit": self.unit, "detail": self.detail, "fix": self.fix}

    def shown(self, key: str) -> str:
        value = getattr(self, key)
        if value is None:
            return "-"
        text = ", ".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
        return f"{text} {self.unit}".strip() if key == "measured" and self.unit else text


def worst_status(records: Iterable[Record]) -> str:
    return max((r.status for r in records), key=STATUS_ORDER.__getitem__, default="skip")


def ran(records: Iterable[Record], *probes: str) -> bool:
    """Whether any record of these probes checked something (pass, warn or fail, not skip)."""
    return any(r.probe in probes and r.status != "skip" for r in records)


def unchecked(records: list[Record], target: str = "") -> list[Record]:
    """A ``fail`` record for each level that checked nothing: the host always, the container when ``target`` names one.

    A probe that printed nothing, or skipped every record, proved nothing; it
    must not add up to a pass. The detail says what could not be checked and why
    (the first skip's reason). A level that already failed needs no second line.
    """
    out = []
    host = [r for r in records if r.probe == "host"]
    if not ran(host, "host"):
        why = _first_reason(host) or "the host probe gave no records"
        out.append(Record("host", "host.checked", "fail", detail=f"nothing was checked on the host: {why}",
                          fix="run checks/verify_host.py --text on the host to see why its checks did not run"))
    inner = [r for r in records if r.probe in ("toolkit", "container")]
    if target and not ran(inner, "container") and not any(r.status == "fail" for r in inner):
        why = _first_reason([r for r in inner if r.probe == "container"]) or "the container probe gave no records"
        out.append(Record("container", "container.checked", "fail", detail=f"nothing was checked in {target}: {why}",
                          fix="run it by hand: docker exec -i NAME python3 - --text < checks/verify_torch.py"))
    return out


def _first_reason(records: list[Record]) -> str:
    if not records:
        return ""
    detail = next((r.detail for r in records if r.detail), "")
    return f"every record was skipped ({detail})" if detail else "every record was skipped"


@dataclass(frozen=True)
class HostVerdict:
    """Every record of one host, in run order (host, toolkit, container), and what they add up to."""

    host: str
    records: tuple[Record, ...]
    level: str = "quick"
    target: str = ""  # "container NAME", "image TAG" or "" (host only)
    seconds: dict[str, float] | None = None  # wall time per probe

    @property
    def worst(self) -> str:
        return worst_status(self.records)

    @property
    def failures(self) -> tuple[Record, ...]:
        return tuple(r for r in self.records if r.status == "fail")

    @property
    def passed(self) -> bool:
        """Proven: the host-level records (the fabric level: its own) ran, not every one skipped, and none failed.

        Nothing checked is never a pass.
        """
        return ran(self.records, "fabric" if self.level == "fabric" else "host") and not self.failures

    def figures(self) -> str:
        """'bf16 780 TFLOP/s (79%), mem 4300 GB/s (90%), train 812 samples/s': what the full level measured."""
        by_id = {r.id: r for r in self.records}
        parts = []
        for rid, label in FIGURES:
            r = by_id.get(rid)
            if r is None or not isinstance(r.measured, (int, float)) or isinstance(r.measured, bool):
                continue
            share = f" ({r.measured / r.expected:.0%})" if isinstance(r.expected, (int, float)) and r.expected else ""
            parts.append(f"{label} {r.measured:g} {r.unit}{share}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"worst": self.worst, "passed": self.passed, "level": self.level, "target": self.target or None,
                "seconds": self.seconds or {}, "records": [r.to_dict() for r in self.records]}

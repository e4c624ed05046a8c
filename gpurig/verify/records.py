"""The records probes emit and one host's verdict built from them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

STATUSES = ("pass", "warn", "fail", "skip")
STATUS_ORDER = {"skip": 0, "pass": 1, "warn": 2, "fail": 3}
# The key figures a fleet row shows: record id -> short label.
FIGURES = (("matmul.bf16", "bf16"), ("matmul.tf32", "tf32"), ("membw", "mem"), ("nccl.allreduce", "nccl"), ("training", "train"))


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
        return {"worst": self.worst, "level": self.level, "target": self.target or None,
                "seconds": self.seconds or {}, "records": [r.to_dict() for r in self.records]}

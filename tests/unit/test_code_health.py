"""The habits that keep the tree readable, as tests CI runs: ruff and mypy clean, no module grown past ~400 lines.

The tools come with the test extras (`pip install -e '.[test]'`); a missing
tool fails here rather than skipping, so a CI that lost it cannot pass silently.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 420  # "none much over 400": the probes in checks/ are exempt, they must stay single files


def _tool(*argv: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_finds_nothing():
    proc = _tool("ruff", "check", "--no-cache", "--output-format", "concise", ".", timeout=120)
    assert "No module named ruff" not in proc.stderr, "ruff is not installed: pip install -e '.[test]'"
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy_finds_nothing():
    proc = _tool("mypy", timeout=600)
    assert "No module named mypy" not in proc.stderr, "mypy is not installed: pip install -e '.[test]'"
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_no_module_is_much_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "gpurig").rglob("*.py"))
            if "skeleton" not in p.parts and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by what they do: {long}"
